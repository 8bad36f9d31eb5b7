"""A team's alert rules, and each alert a rule sent (or is sending) about one job."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from webapp.accounts.models import Team, TeamOwnedQuerySet


class Event(models.TextChoices):
    FAILED = "failed", "the job failed"
    STALLED = "stalled", "the job stalled (no step for the set time)"
    FINISHED = "finished", "the job finished (succeeded)"


class RuleQuerySet(TeamOwnedQuerySet["AlertRule"]):
    pass


class AlertRule(models.Model):
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="alert_rules")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    on_failed = models.BooleanField(default=True, help_text="Tell when one of the team's jobs fails.")
    on_stalled = models.BooleanField(default=False, help_text="Tell when a running job makes no step for "
                                                              "stall_minutes.")
    on_finished = models.BooleanField(default=False, help_text="Tell when a job succeeds.")
    stall_minutes = models.PositiveIntegerField(default=30, help_text="Minutes without a new step after which a "
                                                                      "running job counts as stalled (1-1440).")
    webhook_url = models.URLField(max_length=500, blank=True, help_text="POSTed a JSON body for each alert; a "
                                                                       "loopback or private address is refused "
                                                                       "unless the operator allows its host.")
    email = models.EmailField(blank=True, help_text="Also mailed, where the server has a mail host (EMAIL_HOST).")
    created_at = models.DateTimeField(auto_now_add=True)

    objects = RuleQuerySet.as_manager()

    class Meta:
        ordering = ["pk"]

    def __str__(self) -> str:
        return f"alert rule {self.pk} of {self.team.slug}"

    @property
    def events(self) -> list[str]:
        return [e for e, on in ((Event.FAILED, self.on_failed), (Event.STALLED, self.on_stalled),
                                (Event.FINISHED, self.on_finished)) if on]


class DeliveryStatus(models.TextChoices):
    PENDING = "pending", "Sending"
    SENT = "sent", "Sent"
    FAILED = "failed", "Gave up"


class AlertDelivery(models.Model):
    """One alert of one rule about one job's event: made once (the constraint), sent by a retried task."""

    rule = models.ForeignKey(AlertRule, on_delete=models.CASCADE, related_name="deliveries")
    job = models.ForeignKey("jobs.TrainingJob", on_delete=models.CASCADE, related_name="+")
    event = models.CharField(max_length=10, choices=Event.choices)
    status = models.CharField(max_length=10, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-pk"]
        constraints = [models.UniqueConstraint(fields=["rule", "job", "event"], name="alert_once_per_event")]
