"""Registry entries: a tool or reward known by its import path, and the versions seen of it.

An entry is what a team registered (``package.module:function``); a version is what a worker found there
at one moment, identified by the hash of its source. A job records the versions it actually ran, so a later
edit of the function never rewrites history. Built-ins have no team and are visible to everyone.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from webapp.accounts.models import Team, TeamOwnedQuerySet, signed_in
from webapp.registry.plugins import check_import_path

__all__ = ["Entry", "EntryStatus", "Kind", "Version", "check_import_path"]


class Kind(models.TextChoices):
    TOOL = "tool", "Tool"
    REWARD = "reward", "Reward"


class EntryStatus(models.TextChoices):
    PENDING = "pending", "Inspecting"
    READY = "ready", "Ready"
    FAILED = "failed", "Failed"


class EntryQuerySet(TeamOwnedQuerySet["Entry"]):
    def visible_to(self, user: object) -> EntryQuerySet:
        """Built-ins plus the entries of ``user``'s teams (nothing for anonymous users)."""
        if signed_in(user) is None:
            return self.none()
        return self.filter(team__isnull=True) | super().visible_to(user)

    def tools(self) -> EntryQuerySet:
        return self.filter(kind=Kind.TOOL)

    def rewards(self) -> EntryQuerySet:
        return self.filter(kind=Kind.REWARD)

    def ready(self) -> EntryQuerySet:
        return self.filter(status=EntryStatus.READY, current_version__isnull=False)


class Entry(models.Model):
    kind = models.CharField(max_length=10, choices=Kind.choices)
    team = models.ForeignKey(Team, null=True, blank=True, on_delete=models.CASCADE, related_name="entries",
                             help_text="Owning team; empty for built-ins, which every team sees.")
    import_path = models.CharField(max_length=300)
    name = models.CharField(max_length=200, blank=True, help_text="The tool's or reward's own name.")
    status = models.CharField(max_length=10, choices=EntryStatus.choices, default=EntryStatus.PENDING)
    error = models.TextField(blank=True, help_text="Why the last inspection failed (the import error).")
    current_version = models.ForeignKey("Version", null=True, blank=True, on_delete=models.SET_NULL,
                                        related_name="+")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    inspected_at = models.DateTimeField(null=True, blank=True)

    objects = EntryQuerySet.as_manager()

    class Meta:
        verbose_name_plural = "entries"
        ordering = ["kind", "name", "import_path"]
        constraints = [
            models.UniqueConstraint(fields=["team", "kind", "import_path"], name="entry_unique_per_team"),
            models.UniqueConstraint(fields=["kind", "import_path"], condition=Q(team__isnull=True),
                                    name="builtin_entry_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.name or self.import_path}"

    @property
    def is_builtin(self) -> bool:
        return self.team_id is None

    def can_use(self, user: object) -> bool:
        return self.is_builtin or (self.team is not None and self.team.has_member(user))


class Version(models.Model):
    entry = models.ForeignKey(Entry, on_delete=models.CASCADE, related_name="versions")
    source_hash = models.CharField(max_length=64, help_text="SHA-256 of the function's source.")
    name = models.CharField(max_length=200)
    signature = models.TextField()
    docstring = models.TextField(blank=True)
    schema = models.JSONField(default=dict, blank=True,
                              help_text="Tools: the OpenAI function schema. Rewards: the inputs it takes.")
    resource = models.CharField(max_length=100, blank=True, help_text="The sandbox resource a tool declares.")
    module_file = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [models.UniqueConstraint(fields=["entry", "source_hash"], name="version_unique_hash")]

    def __str__(self) -> str:
        return f"{self.name}@{self.source_hash[:10]}"

    @property
    def short_hash(self) -> str:
        return self.source_hash[:10]
