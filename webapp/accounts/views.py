from __future__ import annotations

from django.contrib import messages
from django.contrib.auth import login
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from webapp.accounts.forms import AddMemberForm, SignupForm, TeamForm
from webapp.accounts.models import Team, do_create_team


@require_http_methods(["GET", "POST"])
def signup(request: HttpRequest) -> HttpResponse:
    form = SignupForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        with transaction.atomic():
            user = form.save()
            do_create_team(form.cleaned_data["team_name"] or f"{user.username}'s team", user)
        login(request, user, backend="django.contrib.auth.backends.ModelBackend")
        messages.success(request, f"Welcome, {user.username}.")
        return redirect("jobs:list")
    return render(request, "registration/signup.html", {"form": form})


@login_required
@require_http_methods(["GET", "POST"])
def team_list(request: HttpRequest) -> HttpResponse:
    form = TeamForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        team = do_create_team(form.cleaned_data["name"], request.user)
        messages.success(request, f"Team {team.name} created.")
        return redirect("accounts:team", slug=team.slug)
    teams = Team.objects.of(request.user).select_related("group")
    status = 400 if request.method == "POST" else 200  # a refused name is bad input, said on its field
    return render(request, "accounts/team_list.html", {"teams": teams, "form": form}, status=status)


@login_required
def team_detail(request: HttpRequest, slug: str) -> HttpResponse:
    team = get_object_or_404(Team.objects.of(request.user), slug=slug)
    return render(request, "accounts/team_detail.html", {"team": team, "form": AddMemberForm()})


@login_required
@require_POST
def team_add_member(request: HttpRequest, slug: str) -> HttpResponse:
    team = get_object_or_404(Team.objects.of(request.user), slug=slug)
    form = AddMemberForm(request.POST)
    if form.is_valid():
        team.add_member(form.cleaned_data["username"])
        messages.success(request, f"{form.cleaned_data['username'].username} joined {team.name}.")
        return redirect("accounts:team", slug=team.slug)
    return render(request, "accounts/team_detail.html", {"team": team, "form": form}, status=400)


@login_required
@require_http_methods(["GET", "POST"])
def api_token(request: HttpRequest) -> HttpResponse:
    """Show the user's REST API token; POST replaces it (the old one stops working at once)."""
    from rest_framework.authtoken.models import Token

    if request.method == "POST":
        with transaction.atomic():
            Token.objects.filter(user=request.user).delete()
            Token.objects.create(user=request.user)
        messages.success(request, "A new token was created; the old one no longer works.")
        return redirect("accounts:token")
    token, _ = Token.objects.get_or_create(user=request.user)
    return render(request, "accounts/token.html", {"token": token})
