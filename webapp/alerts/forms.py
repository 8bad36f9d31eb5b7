from __future__ import annotations

from typing import Any, cast

from django import forms

from webapp.accounts.models import Team
from webapp.alerts.models import AlertRule


class RuleForm(forms.ModelForm):  # type: ignore[type-arg]  # not subscriptable at runtime
    team = forms.ModelChoiceField(queryset=Team.objects.none(), empty_label=None)
    webhook_url = forms.URLField(max_length=500, required=False, assume_scheme="https", label="Webhook URL",
                                 widget=forms.URLInput(attrs={"placeholder": "https://hooks.example.org/agentfly",
                                                              "class": "mono"}),
                                 help_text=AlertRule._meta.get_field("webhook_url").help_text)
    stall_minutes = forms.IntegerField(min_value=1, max_value=1440, initial=30,
                                       help_text="Minutes without a new step after which a running job counts as "
                                                 "stalled.")

    class Meta:
        model = AlertRule
        fields = ["team", "on_failed", "on_stalled", "on_finished", "stall_minutes", "webhook_url", "email"]
        labels = {"on_failed": "When a job fails", "on_stalled": "When a job stalls",
                  "on_finished": "When a job finishes"}

    def __init__(self, *args: Any, user: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        team = cast("forms.ModelChoiceField[Team]", self.fields["team"])
        team.queryset = Team.objects.of(user).select_related("group")
