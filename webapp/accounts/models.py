"""Teams: the unit that owns tools, rewards, jobs and checkpoints.

A team is a Django auth ``Group`` plus a slug: membership is ``user.groups``, so Django admin, permissions
and ``is_member`` all agree on one source of truth. Everything a user can see is filtered through
``Team.objects.of(user)``.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import Group
from django.core.exceptions import PermissionDenied
from django.db import models, transaction
from django.utils import timezone
from django.utils.text import slugify


class TeamQuerySet(models.QuerySet["Team"]):
    def of(self, user: object) -> TeamQuerySet:
        """The teams ``user`` belongs to (none for anonymous users)."""
        if not getattr(user, "is_authenticated", False):
            return self.none()
        return self.filter(group__user=user)


class Team(models.Model):
    group = models.OneToOneField(Group, on_delete=models.CASCADE, related_name="team")
    slug = models.SlugField(max_length=80, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    objects = TeamQuerySet.as_manager()

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.name

    @property
    def name(self) -> str:
        return self.group.name

    @property
    def members(self) -> models.QuerySet:
        return self.group.user_set.order_by("username")

    def has_member(self, user: object) -> bool:
        if not getattr(user, "is_authenticated", False):
            return False
        return self.group.user_set.filter(pk=user.pk).exists()  # type: ignore[attr-defined]

    def add_member(self, user: object) -> None:
        self.group.user_set.add(user)


class TeamNameTaken(ValueError):
    pass


def do_create_team(name: str, creator: object | None) -> Team:
    """Create a team named ``name`` with ``creator`` as its first member; the slug is made unique."""
    name = name.strip()
    if not name:
        raise ValueError("a team needs a name")
    base = slugify(name)[:70] or "team"
    # Never the name of a run folder from before team folders (job-<id>, see jobs.paths), not even once
    # "-2" is added below to "job".
    if re.fullmatch(r"job(-\d+)?", base):
        base = f"team-{base}"
    with transaction.atomic():
        if Group.objects.filter(name=name).exists():
            raise TeamNameTaken(f"a team named {name!r} already exists; pick another name")
        slug, n = base, 1
        while Team.objects.filter(slug=slug).exists():
            n += 1
            slug = f"{base}-{n}"
        group = Group.objects.create(name=name)
        team = Team.objects.create(group=group, slug=slug, created_by=creator)
        if creator is not None:
            team.add_member(creator)
    return team


# ------------------------------------------------------------------------------------------ invitations
def invitation_digest(token: str) -> str:
    # Only a hash is stored: a leaked database (or a staff member reading the admin) yields no usable link.
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


class InvitationQuerySet(models.QuerySet["Invitation"]):
    def of(self, user: object) -> InvitationQuerySet:
        """Invitations of ``user``'s teams."""
        return self.filter(team__in=Team.objects.of(user))

    def usable(self) -> InvitationQuerySet:
        return self.filter(used_at__isnull=True, revoked_at__isnull=True, expires_at__gt=timezone.now())


class Invitation(models.Model):
    """A single-use link that signs a new user up straight into ``team``, until ``expires_at``."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="invitations")
    digest = models.CharField(max_length=64, unique=True, help_text="SHA-256 of the link's secret.")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    used_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                related_name="+")
    used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = InvitationQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"invitation to {self.team} ({self.state})"

    @property
    def state(self) -> str:
        if self.used_at:
            return "used"
        if self.revoked_at:
            return "revoked"
        if self.expires_at <= timezone.now():
            return "expired"
        return "pending"

    def refusal(self) -> str | None:
        """Why this invitation cannot be used any more, or None while it can."""
        ask = f"ask a member of {self.team.name} for a new one"
        if self.used_at:
            return f"This invitation was already used; each link signs up one person. Sign in, or {ask}."
        if self.revoked_at:
            return f"This invitation was revoked; {ask}."
        if self.expires_at <= timezone.now():
            return f"This invitation expired on {self.expires_at:%Y-%m-%d %H:%M} UTC; {ask}."
        return None


class InvitationRefused(ValueError):
    pass


def _require_member(team: Team, user: object) -> None:
    # The views already look teams up through Team.objects.of(user); this holds for any other caller too.
    if not team.has_member(user):
        raise PermissionDenied(f"only members of {team.name} can manage its invitations")


def do_create_invitation(team: Team, user: object) -> tuple[Invitation, str]:
    """Create an invitation into ``team`` by its member ``user``; return it and the secret for its link."""
    _require_member(team, user)
    if settings.AGENTFLY_SIGNUP == "closed":
        raise InvitationRefused("sign-up is closed on this server (AGENTFLY_SIGNUP=closed): an administrator "
                                "creates accounts, so an invitation could not be used")
    token = secrets.token_urlsafe(32)
    with transaction.atomic():
        invitation = Invitation.objects.create(
            team=team, digest=invitation_digest(token), created_by=user,
            expires_at=timezone.now() + timedelta(days=settings.AGENTFLY_INVITE_DAYS),
        )
    return invitation, token


def do_revoke_invitation(invitation: Invitation, user: object) -> Invitation:
    _require_member(invitation.team, user)
    with transaction.atomic():
        Invitation.objects.filter(pk=invitation.pk, used_at__isnull=True, revoked_at__isnull=True).update(
            revoked_at=timezone.now())
    invitation.refresh_from_db()
    return invitation


def find_invitation(token: str) -> Invitation:
    """The invitation a link's secret names, or InvitationRefused saying why it cannot be used."""
    invitation = Invitation.objects.select_related("team__group").filter(digest=invitation_digest(token)).first()
    if invitation is None:
        raise InvitationRefused("This invitation link is not valid (it may have been copied incompletely); "
                                "ask a member of the team you want to join for a new one.")
    if (reason := invitation.refusal()) is not None:
        raise InvitationRefused(reason)
    return invitation


def do_sign_up(form: Any, invitation: Invitation | None) -> Any:
    """Create the user of a valid sign-up ``form``: into ``invitation``'s team, or into a new team of their own.

    The invitation row is locked and checked again inside the transaction, so two sign-ups racing on one link
    make one account; the other gets InvitationRefused and nothing is created.
    """
    with transaction.atomic():
        if invitation is not None:
            invitation = Invitation.objects.select_for_update().select_related("team__group").get(pk=invitation.pk)
            if (reason := invitation.refusal()) is not None:
                raise InvitationRefused(reason)
        user = form.save()
        if invitation is None:
            do_create_team(form.cleaned_data.get("team_name") or f"{user.username}'s team", user)
        else:
            invitation.team.add_member(user)
            invitation.used_by, invitation.used_at = user, timezone.now()
            invitation.save(update_fields=["used_by", "used_at"])
    return user
