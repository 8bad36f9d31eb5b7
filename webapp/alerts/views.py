"""The alerts page: a team's rules (add, remove) and the alerts they sent, with each one's outcome. Views parse,
call one action, render; a team sees and removes only its own rules."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from webapp.alerts import actions
from webapp.alerts.forms import RuleForm
from webapp.alerts.models import AlertDelivery, AlertRule
from webapp.alerts.webhooks import WebhookRefused


@login_required
@require_http_methods(["GET", "POST"])
def alerts(request: HttpRequest) -> HttpResponse:
    form = RuleForm(request.POST or None, user=request.user)
    if request.method == "POST" and form.is_valid():
        data = dict(form.cleaned_data)
        try:
            actions.do_add_rule(user=request.user, **data)
        except WebhookRefused as exc:
            form.add_error("webhook_url", str(exc))
        except ValueError as exc:
            form.add_error(None, str(exc))
        else:
            messages.success(request, "Alert saved: the next matching job event is sent.")
            return redirect("alerts:list")
    rules = AlertRule.objects.visible_to(request.user).select_related("team")
    deliveries = (AlertDelivery.objects.filter(rule__in=rules).select_related("job", "rule__team")[:50])
    return render(request, "alerts/alerts.html", {"form": form, "rules": rules, "deliveries": deliveries},
                  status=400 if form.errors else 200)


@login_required
@require_POST
def remove(request: HttpRequest, pk: int) -> HttpResponse:
    rule = get_object_or_404(AlertRule.objects.visible_to(request.user), pk=pk)
    actions.do_remove_rule(user=request.user, rule=rule)
    messages.info(request, "Alert removed.")
    return redirect("alerts:list")
