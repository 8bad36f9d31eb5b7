"""Saving and removing a team's alert rules: the webhook URL is checked before anything is stored."""

from __future__ import annotations

from typing import Any

from webapp.accounts.models import Team
from webapp.alerts.models import AlertRule
from webapp.alerts.webhooks import check_webhook_url


def do_add_rule(*, user: object, team: Team, **fields: Any) -> AlertRule:
    """A new rule for ``team``; WebhookRefused for a URL the server may not call, ValueError for a rule that
    would never tell anyone anything."""
    if not team.has_member(user):
        raise PermissionError("you can only add alerts for a team you belong to")
    if not (fields.get("on_failed") or fields.get("on_stalled") or fields.get("on_finished")):
        raise ValueError("choose at least one of failed, stalled or finished")
    if not (fields.get("webhook_url") or fields.get("email")):
        raise ValueError("give a webhook URL or an email address to send the alerts to")
    if fields.get("webhook_url"):
        check_webhook_url(fields["webhook_url"])
    return AlertRule.objects.create(team=team, created_by=user, **fields)


def do_remove_rule(*, user: object, rule: AlertRule) -> None:
    if not rule.team.has_member(user):
        raise PermissionError("you can only remove alerts of a team you belong to")
    rule.delete()
