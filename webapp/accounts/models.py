"""Teams: the unit that owns tools, rewards, jobs and checkpoints.

A team is a Django auth ``Group`` plus a slug: membership is ``user.groups``, so Django admin, permissions
and ``is_member`` all agree on one source of truth. Everything a user can see is filtered through
``Team.objects.of(user)``.

A member is also the team's **admin** when they are in ``Team.admins`` (always a subset of the members; the
team's creator is its first admin). Only admins invite, revoke invitations and remove members, and a staff
member changes a user in the admin only when they administer every team of that user.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import sys
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Self, TypeGuard, TypeVar, cast

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.exceptions import PermissionDenied
from django.db import models, transaction
from django.utils import timezone
from django.utils.text import slugify

if TYPE_CHECKING:
    from django.contrib.auth.models import User


def signed_in(user: object) -> User | None:
    """``user`` when it is a signed-in user, else None. ``user`` is whatever a caller holds (``request.user``,
    a websocket scope's user, an anonymous user, None): this is where it becomes a typed one."""
    return cast("User", user) if getattr(user, "is_authenticated", False) else None


M = TypeVar("M", bound=models.Model)


class TeamOwnedQuerySet(models.QuerySet[M]):
    """Rows of a model that belongs to a team (a ``team`` foreign key). A user sees its teams' rows: this is
    the one filter that says so, for jobs, sweeps, alert rules, MCP servers and invitations (the registry adds
    the built-ins to it)."""

    def visible_to(self, user: object) -> Self:
        """The rows of ``user``'s teams (none for anonymous users)."""
        return self.filter(team__in=Team.objects.of(user))


class TeamQuerySet(models.QuerySet["Team"]):
    def of(self, user: object) -> TeamQuerySet:
        """The teams ``user`` belongs to (none for anonymous users)."""
        if (member := signed_in(user)) is None:
            return self.none()
        return self.filter(group__user=member)

    def administered_by(self, user: object) -> TeamQuerySet:
        """The teams ``user`` administers (a subset of ``of(user)``)."""
        if (member := signed_in(user)) is None:
            return self.none()
        return self.of(member).filter(admins=member)


class Team(models.Model):
    group = models.OneToOneField(Group, on_delete=models.CASCADE, related_name="team")
    slug = models.SlugField(max_length=80, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    admins = models.ManyToManyField(
        settings.AUTH_USER_MODEL, blank=True, related_name="administered_teams",
        help_text="Members who invite, revoke invitations, remove members and make members admins (the creator "
                  "first). In the admin only a superuser changes it; admins are always members.",
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
    def members(self) -> models.QuerySet[User]:
        return self.group.user_set.order_by("username")

    def has_member(self, user: object) -> TypeGuard[User]:
        """Whether ``user`` is a signed-in member (after a True answer the type checker knows a ``User``)."""
        if (member := signed_in(user)) is None:
            return False
        return self.group.user_set.filter(pk=member.pk).exists()

    def is_admin(self, user: object) -> TypeGuard[User]:
        if (member := signed_in(user)) is None:
            return False
        return self.has_member(member) and self.admins.filter(pk=member.pk).exists()

    def add_member(self, user: User, *, admin: bool = False) -> None:
        """Make ``user`` a member (an admin too with ``admin``). Only consent paths call this: accepting an
        invitation, signing up through a link, creating a team, and the operator's own tools (``createuser``,
        the demo)."""
        self.group.user_set.add(user)
        if admin:
            self.admins.add(user)

    def clean(self) -> None:
        # The admin's change form edits the slug too: it must obey the same reservation as a new team's.
        if (reason := slug_refusal(self.slug)) is not None:
            from django.core.exceptions import ValidationError

            raise ValidationError({"slug": reason})


class TeamNameTaken(ValueError):
    pass


class TeamLimitReached(ValueError):
    """The creator has created as many teams as one person may (``AGENTFLY_TEAMS_PER_USER``)."""


# Slugs that name the app's own packages and routes. A team's plugin folder is ``<plugin dir>/<slug>/``, so a
# slug is also a folder name a worker may import from: it must never be one a shared module already uses.
RESERVED_SLUGS = frozenset({
    "agentfly", "agentfly_teams", "trainer", "webapp", "tests", "admin", "api", "accounts", "static", "media",
    "registry", "jobs", "monitor", "new", "shared", "builtin", "builtins", "site-packages",
})


def shared_package_names() -> set[str]:
    """Top-level names of the shared plugin modules (``AGENTFLY_PLUGIN_DIRS``) and ``AGENTFLY_TOOL_PACKAGES``.

    A folder in a plugin dir is a team's folder when a team has its name; a team named like a shared package
    would otherwise take that package over (the other teams' registrations of it would be refused as
    "another team's folder").
    """
    names = {name.split(".")[0] for name in settings.AGENTFLY_TOOL_PACKAGES}
    for folder in settings.AGENTFLY_PLUGIN_DIRS:
        try:
            children = list(folder.iterdir())
        except OSError:
            continue
        for child in children:
            if child.suffix == ".py":
                names.add(child.stem)
            elif (child / "__init__.py").is_file():
                names.add(child.name)
    return names


def slug_refusal(slug: str) -> str | None:
    """Why ``slug`` cannot be a team's slug, or None when it can."""
    plain = slug.lower()
    if plain in RESERVED_SLUGS or plain.replace("-", "_") in RESERVED_SLUGS:
        return f"the slug {slug!r} is reserved by AgentFly; pick another"
    if plain in sys.stdlib_module_names or plain.replace("-", "_") in sys.stdlib_module_names:
        return f"the slug {slug!r} is the name of a Python standard library module; pick another"
    if plain in shared_package_names() or plain.replace("-", "_") in shared_package_names():
        return (f"the slug {slug!r} is the name of a shared plugin package (in AGENTFLY_PLUGIN_DIRS or "
                "AGENTFLY_TOOL_PACKAGES), which every team registers from; pick another")
    return None


def do_create_team(name: str, creator: User | None) -> Team:
    """Create a team named ``name`` with ``creator`` as its first member; the slug is made unique."""
    name = name.strip()
    if not name:
        raise ValueError("a team needs a name")
    base = slugify(name)[:70] or "team"
    # Never the name of a run folder from before team folders (job-<id>, see jobs.paths), not even once
    # "-2" is added below to "job".
    if re.fullmatch(r"job(-\d+)?", base) or slug_refusal(base) is not None:
        base = f"team-{base}"
    with transaction.atomic():
        if creator is not None:
            # Quotas count per team as well as per person; without a cap, a new team would be new room. The
            # creator's row lock makes two creations at once count each other.
            get_user_model().objects.select_for_update().filter(pk=creator.pk).first()
            made = Team.objects.filter(created_by=creator).count()
            if made >= settings.AGENTFLY_TEAMS_PER_USER:
                raise TeamLimitReached(
                    f"you have created {made} teams, as many as one person may (AGENTFLY_TEAMS_PER_USER="
                    f"{settings.AGENTFLY_TEAMS_PER_USER}); work in one of them, or ask an operator to raise the limit")
        if Group.objects.filter(name=name).exists():
            raise TeamNameTaken(f"a team named {name!r} already exists; pick another name")
        slug, n = base, 1
        while Team.objects.filter(slug=slug).exists():
            n += 1
            slug = f"{base}-{n}"
        group = Group.objects.create(name=name)
        team = Team.objects.create(group=group, slug=slug, created_by=creator)
        if creator is not None:
            team.add_member(creator, admin=True)
    return team


# ------------------------------------------------------------------------------------------ invitations
def invitation_digest(token: str) -> str:
    # Only a hash is stored: a leaked database (or a staff member reading the admin) yields no usable link.
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


class InvitationQuerySet(TeamOwnedQuerySet["Invitation"]):
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


class NotTeamAdmin(PermissionDenied):
    """The caller is a member of the team but not one of its admins; the message names them."""


def _require_admin(team: Team, user: object, what: str) -> User:
    """``user``, once it is one of ``team``'s admins; PermissionDenied or NotTeamAdmin otherwise."""
    # The views already look teams up through Team.objects.of(user); this holds for any other caller too.
    if not team.has_member(user):
        raise PermissionDenied(f"only members of {team.name} can manage its invitations")
    if not team.is_admin(user):
        admins = ", ".join(team.admins.filter(groups=team.group).order_by("username")
                           .values_list("username", flat=True)) or "none yet: a superuser names one in the admin"
        raise NotTeamAdmin(f"only the admins of {team.name} can {what} (its admins: {admins}); ask one of them, "
                           "or ask them to make you an admin")
    return user


def do_create_invitation(team: Team, user: object) -> tuple[Invitation, str]:
    """Create an invitation into ``team`` by its admin ``user``; return it and the secret for its link."""
    admin = _require_admin(team, user, "create invitation links")
    if settings.AGENTFLY_SIGNUP == "closed":
        raise InvitationRefused("sign-up is closed on this server (AGENTFLY_SIGNUP=closed): an administrator "
                                "creates accounts, so an invitation could not be used")
    token = secrets.token_urlsafe(32)
    with transaction.atomic():
        invitation = Invitation.objects.create(
            team=team, digest=invitation_digest(token), created_by=admin,
            expires_at=timezone.now() + timedelta(days=settings.AGENTFLY_INVITE_DAYS),
        )
    return invitation, token


def do_revoke_invitation(invitation: Invitation, user: object) -> Invitation:
    _require_admin(invitation.team, user, "revoke invitations")
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


# ------------------------------------------------------------------------------ invitations of existing users
class MembershipInvitationQuerySet(models.QuerySet["MembershipInvitation"]):
    def pending(self) -> MembershipInvitationQuerySet:
        return self.filter(answered_at__isnull=True)

    def to(self, user: object) -> MembershipInvitationQuerySet:
        """Invitations addressed to ``user``."""
        if (member := signed_in(user)) is None:
            return self.none()
        return self.filter(invitee=member)

    def of(self, user: object) -> MembershipInvitationQuerySet:
        """Invitations into ``user``'s teams, and those addressed to ``user``."""
        if (member := signed_in(user)) is None:
            return self.none()
        return self.filter(models.Q(team__in=Team.objects.of(member)) | models.Q(invitee=member))


class MembershipInvitation(models.Model):
    """A user invited into ``team`` by name: they become a member only by accepting it (consent).

    A name no active user has makes an invitation too, with no ``invitee``, shown to the team as pending like
    any other and addressed to nobody (a user who signs up with that name later does not get it), so neither
    the answer to an invitation nor the team's list of them tells a made-up username from a real one."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="member_invitations")
    invitee = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE,
                                related_name="team_invitations")
    invitee_name = models.CharField(max_length=150, blank=True, help_text="The username the invitation was made "
                                                                          "for, as the team admin gave it.")
    invited_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    answered_at = models.DateTimeField(null=True, blank=True)
    accepted = models.BooleanField(null=True, blank=True)

    objects = MembershipInvitationQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        constraints = [models.UniqueConstraint(fields=["team", "invitee"], condition=models.Q(answered_at__isnull=True),
                                               name="one_pending_invitation_per_user_and_team"),
                       models.UniqueConstraint(fields=["team", "invitee_name"],
                                               condition=models.Q(answered_at__isnull=True, invitee__isnull=True),
                                               name="one_pending_invitation_per_unknown_name_and_team")]

    def __str__(self) -> str:
        return f"{self.invitee_name} invited to {self.team} ({self.state})"

    @property
    def state(self) -> str:
        if self.answered_at is None:
            return "pending"
        return "accepted" if self.accepted else "declined"


def do_invite_member(team: Team, inviter: object, username: str) -> MembershipInvitation:
    """Invite the user called ``username`` into ``team`` (by its admin ``inviter``); they accept or decline.

    A name no active user has gets the same answer, an invitation addressed to nobody (see
    ``MembershipInvitation``): the inviter learns nothing about which usernames exist. A member already in the
    team is refused by name (the team's members are no secret to its admin)."""
    from django.contrib.auth import get_user_model

    admin = _require_admin(team, inviter, "invite members")
    name = username.strip()
    if not name:
        raise InvitationRefused("give the username of the person to invite")
    invitee = get_user_model().objects.filter(username=name, is_active=True).first()
    if invitee is not None and team.has_member(invitee):
        raise InvitationRefused(f"{invitee.username} is already a member of {team.name}")
    with transaction.atomic():
        invitation, _ = MembershipInvitation.objects.select_for_update().get_or_create(
            team=team, invitee=invitee, answered_at__isnull=True, **({} if invitee else {"invitee_name": name}),
            defaults={"invited_by": admin, "invitee_name": name})
    return invitation


def do_answer_invitation(invitation: MembershipInvitation, user: object, *, accept: bool) -> MembershipInvitation:
    """The invitee accepts (joins the team) or declines; anyone else, or a second answer, is refused."""
    with transaction.atomic():
        invitation = MembershipInvitation.objects.select_for_update().select_related("team__group").get(pk=invitation.pk)
        if invitation.invitee_id != getattr(user, "pk", None):
            raise PermissionDenied("only the invited user can answer an invitation")
        if invitation.answered_at is not None:
            raise InvitationRefused(f"this invitation was already {invitation.state}")
        invitation.answered_at, invitation.accepted = timezone.now(), accept
        invitation.save(update_fields=["answered_at", "accepted"])
        if accept:
            invitation.team.add_member(cast("User", user))  # the invitee: its pk was checked above
    return invitation


class MemberRefused(ValueError):
    pass


def do_remove_member(team: Team, by: object, username: str) -> Any:
    """Take ``username`` out of ``team`` (and out of its admins): by one of the team's admins, or by the member
    themselves (leaving). The last admin cannot go, so a team always has someone who can invite."""
    from django.contrib.auth import get_user_model

    if username != getattr(by, "username", None):
        _require_admin(team, by, "remove members")
    with transaction.atomic():
        Team.objects.select_for_update().get(pk=team.pk)  # one removal at a time: the last-admin check holds
        member = get_user_model().objects.filter(username=username, groups=team.group).first()
        if member is None:
            raise MemberRefused(f"{username} is not a member of {team.name}")
        if (team.admins.filter(pk=member.pk).exists()
                and not team.admins.filter(groups=team.group).exclude(pk=member.pk).exists()):
            raise MemberRefused(f"{username} is the last admin of {team.name}; make another member an admin first")
        team.admins.remove(member)
        team.group.user_set.remove(member)
    return member


def do_make_admin(team: Team, admin: object, username: str) -> Any:
    """Make the member ``username`` an admin of ``team`` too, by one of its admins."""
    from django.contrib.auth import get_user_model

    _require_admin(team, admin, "make members admins")
    member = get_user_model().objects.filter(username=username, groups=team.group).first()
    if member is None:
        raise MemberRefused(f"{username} is not a member of {team.name}; invite them first")
    team.admins.add(member)
    return member
