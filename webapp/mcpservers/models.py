"""A team's MCP server (how to start or reach it) and the tool listings a worker read from it, as versions.

A version is one listing, identified by the hash of its tools' names, descriptions and schemas, so a server
that changes its tools gets a new version and a job keeps the one it ran. Unlike registry entries there are no
built-ins: every server belongs to one team, and only that team sees, tries or uses it.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from webapp.accounts.models import Team, TeamOwnedQuerySet


class Transport(models.TextChoices):
    STDIO = "stdio", "stdio (a script in the team's plugin folder, or an allowlisted command)"
    HTTP = "http", "streamable HTTP (a URL on the allowlist)"


class Status(models.TextChoices):
    PENDING = "pending", "Inspecting"
    READY = "ready", "Ready"
    FAILED = "failed", "Failed"


class ServerQuerySet(TeamOwnedQuerySet["MCPServer"]):
    """Only the servers of ``user``'s teams are visible to them: no built-ins, nothing shared."""


class MCPServer(models.Model):
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="mcp_servers")
    name = models.SlugField(max_length=60, help_text="The resource name its tools ask for.")
    transport = models.CharField(max_length=5, choices=Transport.choices)
    command = models.JSONField(default=list, blank=True,
                               help_text="stdio: the argv as registered (a script path inside the team folder, "
                                         "or an allowlisted command).")
    url = models.CharField(max_length=500, blank=True, help_text="HTTP: the endpoint.")
    reset_tool = models.CharField(max_length=64, blank=True,
                                  help_text="A tool that forgets a session's state, called between rollouts instead "
                                            "of restarting the server; hidden from the model.")
    seed_tool = models.CharField(max_length=64, blank=True,
                                 help_text="A tool called at a rollout's first call with the task sample's fields "
                                           "its input schema names; hidden from the model.")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    error = models.TextField(blank=True)
    current_version = models.ForeignKey("MCPServerVersion", null=True, blank=True, on_delete=models.SET_NULL,
                                        related_name="+")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    inspected_at = models.DateTimeField(null=True, blank=True)

    objects = ServerQuerySet.as_manager()

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="mcp_server_unique_per_team")]

    def __str__(self) -> str:
        return f"MCP server {self.name}"

    @property
    def model_tools(self) -> list[str]:
        """The tools of its current listing a job's agent gets: all but the reset and seed tools."""
        hidden = {self.reset_tool, self.seed_tool} - {""}
        listing = self.current_version.tools if self.current_version else []
        return [t["name"] for t in listing if t["name"] not in hidden]


class MCPServerVersion(models.Model):
    server = models.ForeignKey(MCPServer, on_delete=models.CASCADE, related_name="versions")
    listing_hash = models.CharField(max_length=64)
    tools = models.JSONField(default=list, help_text="[{name, description, input_schema}], bounded in size.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [models.UniqueConstraint(fields=["server", "listing_hash"], name="mcp_version_unique_hash")]


__all__ = ["MCPServer", "MCPServerVersion", "Q", "Status", "Transport"]
