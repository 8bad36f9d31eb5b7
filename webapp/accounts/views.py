from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import login
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from webapp.accounts.forms import AddMemberForm, InvitedSignupForm, SignupForm, TeamForm
from webapp.accounts.models import (
    Invitation,
    InvitationRefused,
    MemberRefused,
    MembershipInvitation,
    NotTeamAdmin,
    Team,
    TeamLimitReached,
    do_answer_invitation,
    do_create_invitation,
    do_create_team,
    do_invite_member,
    do_make_admin,
    do_remove_member,
    do_revoke_invitation,
    do_sign_up,
    find_invitation,
)
from webapp.accounts.throttling import throttle

if TYPE_CHECKING:
    from django.contrib.auth.models import User

SIGNUP_CLOSED = ("Sign-up is closed on this server: an administrator creates accounts (manage.py createsuperuser, "
                 "or the admin site). Ask yours for one.")
SIGNUP_NEEDS_INVITATION = ("Sign-up on this server is by invitation only. Ask an admin of the team you want to join "
                           "to create an invitation link on their team page (Teams, then the team, then \"Create an "
                           "invitation link\"), and open that link.")


def signup_refused(request: HttpRequest, reason: str) -> HttpResponse:
    return render(request, "registration/signup_refused.html", {"reason": reason}, status=403)


@require_http_methods(["GET", "POST"])
@throttle("signup")
def signup(request: HttpRequest, token: str | None = None) -> HttpResponse:
    """Sign up as ``AGENTFLY_SIGNUP`` allows: anyone (open), with an invitation link (invite), nobody (closed)."""
    if settings.AGENTFLY_SIGNUP == "closed":
        return signup_refused(request, SIGNUP_CLOSED)
    invitation = None
    if token is not None:
        try:
            invitation = find_invitation(token)
        except InvitationRefused as exc:
            return signup_refused(request, str(exc))
    elif settings.AGENTFLY_SIGNUP == "invite":
        return signup_refused(request, SIGNUP_NEEDS_INVITATION)
    form = (InvitedSignupForm if invitation else SignupForm)(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            user = do_sign_up(form, invitation)
        except InvitationRefused as exc:  # another sign-up used the link a moment ago
            return signup_refused(request, str(exc))
        login(request, user, backend="django.contrib.auth.backends.ModelBackend")
        messages.success(request, f"Welcome, {user.username}." + (f" You are in {invitation.team.name}." if invitation else ""))
        return redirect("jobs:list")
    return render(request, "registration/signup.html", {"form": form, "invitation": invitation})


def locked_out(request: HttpRequest, original_response: Any = None, credentials: dict[str, Any] | None = None) -> HttpResponse:
    """django-axes' lockout response (``AXES_LOCKOUT_CALLABLE``): say how long to wait, with a Retry-After."""
    cooloff = settings.AXES_COOLOFF_TIME
    username = (credentials or {}).get("username") or request.POST.get("username", "")
    response = render(request, "registration/locked_out.html", {
        "failure_limit": settings.AXES_FAILURE_LIMIT, "username": username,
        "minutes": max(1, round(cooloff.total_seconds() / 60)),
    }, status=429)
    response["Retry-After"] = str(int(cooloff.total_seconds()))
    return response


@login_required
@require_http_methods(["GET", "POST"])
@throttle("team")
def team_list(request: HttpRequest) -> HttpResponse:
    form = TeamForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            team = do_create_team(form.cleaned_data["name"], cast("User", request.user))  # login_required
        except TeamLimitReached as exc:
            form.add_error("name", sentence(exc))
        else:
            messages.success(request, f"Team {team.name} created.")
            return redirect("accounts:team", slug=team.slug)
    teams = Team.objects.of(request.user).select_related("group")
    status = 400 if request.method == "POST" else 200  # a refused name is bad input, said on its field
    pending = MembershipInvitation.objects.to(request.user).pending().count()
    return render(request, "accounts/team_list.html", {"teams": teams, "form": form, "pending_invitations": pending},
                  status=status)


def sentence(exc: Exception) -> str:
    return f"{str(exc)[:1].upper()}{str(exc)[1:]}."


def render_team(request: HttpRequest, team: Team, form: AddMemberForm, status: int = 200) -> HttpResponse:
    return render(request, "accounts/team_detail.html", {
        "team": team, "form": form, "invite_days": settings.AGENTFLY_INVITE_DAYS,
        "is_admin": team.is_admin(request.user), "admin_ids": set(team.admins.values_list("pk", flat=True)),
        "invitations": team.invitations.select_related("created_by", "used_by")[:20],
        "member_invitations": team.member_invitations.select_related("invited_by")[:20],
        "api_quotas": team.api_quotas.all(),  # the operator's limits on the team's APIs, read-only here
        # The link's secret is stored only as a hash: it is shown once, on the page right after creating it.
        "new_invitation_link": request.session.pop("new_invitation_link", None),
    }, status=status)


@login_required
def team_detail(request: HttpRequest, slug: str) -> HttpResponse:
    team = get_object_or_404(Team.objects.of(request.user), slug=slug)
    return render_team(request, team, AddMemberForm())


@login_required
@require_POST
def team_add_member(request: HttpRequest, slug: str) -> HttpResponse:
    """Invite an existing user: they join only when they accept, on their Invitations page."""
    team = get_object_or_404(Team.objects.of(request.user), slug=slug)
    form = AddMemberForm(request.POST)
    if form.is_valid():
        try:
            invitation = do_invite_member(team, request.user, form.cleaned_data["username"])
        except NotTeamAdmin as exc:
            form.add_error("username", sentence(exc))
            return render_team(request, team, form, status=403)
        except InvitationRefused as exc:
            form.add_error("username", sentence(exc))
        else:
            messages.success(request, f"{invitation.invitee_name} is invited to {team.name}; they join once "
                                      "they accept it on their Invitations page.")
            return redirect("accounts:team", slug=team.slug)
    return render_team(request, team, form, status=400)


def act_on_member(request: HttpRequest, slug: str, username: str,
                  act: Callable[[Team, Any, str], Any]) -> tuple[Team, Any] | HttpResponse:
    """``act(team, actor, username)`` on a team of the signed-in user: the team and the member it acted on, or
    the page that says why it was refused."""
    team = get_object_or_404(Team.objects.of(request.user), slug=slug)
    try:
        return team, act(team, request.user, username)
    except NotTeamAdmin as exc:
        messages.error(request, sentence(exc))
        return render_team(request, team, AddMemberForm(), status=403)
    except MemberRefused as exc:
        messages.error(request, f"{exc}.")  # it starts with a username, which keeps its case
        return redirect("accounts:team", slug=team.slug)


@login_required
@require_POST
def team_remove_member(request: HttpRequest, slug: str, username: str) -> HttpResponse:
    """An admin takes a member out of the team; a member may take themselves out (leave)."""
    acted = act_on_member(request, slug, username, do_remove_member)
    if isinstance(acted, HttpResponse):
        return acted
    team, member = acted
    if member.pk == request.user.pk:
        messages.info(request, f"You left {team.name}.")
        return redirect("accounts:teams")
    messages.success(request, f"{member.username} is no longer a member of {team.name}.")
    return redirect("accounts:team", slug=team.slug)


@login_required
@require_POST
def team_make_admin(request: HttpRequest, slug: str, username: str) -> HttpResponse:
    acted = act_on_member(request, slug, username, do_make_admin)
    if isinstance(acted, HttpResponse):
        return acted
    team, member = acted
    messages.success(request, f"{member.username} is now an admin of {team.name}.")
    return redirect("accounts:team", slug=team.slug)


@login_required
def my_invitations(request: HttpRequest) -> HttpResponse:
    """The invitations addressed to the signed-in user, to accept or decline."""
    invitations = MembershipInvitation.objects.to(request.user).select_related("team__group", "invited_by")
    return render(request, "accounts/invitations.html", {"invitations": invitations[:50]})


@login_required
@require_POST
def answer_invitation(request: HttpRequest, pk: int, answer: str) -> HttpResponse:
    # Only the invitee's own invitations resolve: anyone else's reads as not found.
    invitation = get_object_or_404(MembershipInvitation.objects.to(request.user), pk=pk)
    try:
        invitation = do_answer_invitation(invitation, request.user, accept=answer == "accept")
    except InvitationRefused as exc:
        messages.error(request, f"{str(exc)[:1].upper()}{str(exc)[1:]}.")
        return redirect("accounts:invitations")
    if invitation.accepted:
        messages.success(request, f"You joined {invitation.team.name}.")
        return redirect("accounts:team", slug=invitation.team.slug)
    messages.info(request, f"You declined the invitation to {invitation.team.name}.")
    return redirect("accounts:invitations")


@login_required
@require_POST
def invitation_create(request: HttpRequest, slug: str) -> HttpResponse:
    team = get_object_or_404(Team.objects.of(request.user), slug=slug)
    try:
        invitation, token = do_create_invitation(team, request.user)
    except NotTeamAdmin as exc:
        messages.error(request, f"No invitation was created: {exc}.")
        return render_team(request, team, AddMemberForm(), status=403)
    except InvitationRefused as exc:
        messages.error(request, f"No invitation was created: {exc}.")
        return redirect("accounts:team", slug=team.slug)
    request.session["new_invitation_link"] = request.build_absolute_uri(reverse("accounts:signup_invited", args=[token]))
    messages.success(request, f"Invitation created; it signs up one person into {team.name} until "
                              f"{invitation.expires_at:%Y-%m-%d %H:%M} UTC.")
    return redirect("accounts:team", slug=team.slug)


@login_required
@require_POST
def invitation_revoke(request: HttpRequest, slug: str, pk: int) -> HttpResponse:
    invitation = get_object_or_404(Invitation.objects.visible_to(request.user).filter(team__slug=slug), pk=pk)
    try:
        invitation = do_revoke_invitation(invitation, request.user)
    except NotTeamAdmin as exc:
        messages.error(request, f"The invitation was not revoked: {exc}.")
        return render_team(request, invitation.team, AddMemberForm(), status=403)
    messages.info(request, "Invitation revoked." if invitation.state == "revoked" else
                  f"The invitation was already {invitation.state}.")
    return redirect("accounts:team", slug=slug)


@login_required
@require_http_methods(["GET", "POST"])
def api_token(request: HttpRequest) -> HttpResponse:
    """Show the user's REST API token; POST replaces it (the old one stops working at once)."""
    from rest_framework.authtoken.models import Token

    user = cast("User", request.user)  # login_required
    if request.method == "POST":
        with transaction.atomic():
            Token.objects.filter(user=user).delete()
            Token.objects.create(user=user)
        messages.success(request, "A new token was created; the old one no longer works.")
        return redirect("accounts:token")
    token, _ = Token.objects.get_or_create(user=user)
    # The page's launch example names real registry entries through the registry's own template tag
    # (builtin_entry): the registry depends on accounts, never the reverse.
    return render(request, "accounts/token.html", {"token": token})
