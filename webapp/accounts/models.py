"""Teams: the unit that owns tools, rewards, jobs and checkpoints.

A team is a Django auth ``Group`` plus a slug: membership is ``user.groups``, so Django admin, permissions
and ``is_member`` all agree on one source of truth. Everything a user can see is filtered through
``Team.objects.of(user)``.
"""

from __future__ import annotations

import re

from django.conf import settings
from django.contrib.auth.models import Group
from django.db import models, transaction
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
