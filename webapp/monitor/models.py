"""``JobEvent``: everything a job emitted, in order. The one source of truth for charts and logs.

``seq`` numbers a job's events 1, 2, 3, ... with no gaps; a page that loaded history up to ``seq = n`` and
then hears live events can drop those ``<= n`` and notice a gap (reload from ``n``) — no duplicates, no holes.
"""

from __future__ import annotations

from typing import Any

from django.db import models

from trainer.events import EVENT_TYPES

# The trainer's event types are the one list (``trainer.events.EVENT_TYPES``); the stored column takes them.
EventType = models.TextChoices("EventType", [(t.upper(), t) for t in EVENT_TYPES])  # type: ignore[call-overload]


class JobEvent(models.Model):
    job = models.ForeignKey("jobs.TrainingJob", on_delete=models.CASCADE, related_name="events")
    seq = models.PositiveBigIntegerField()
    type = models.CharField(max_length=16, choices=EventType.choices)
    step = models.IntegerField(null=True, blank=True)
    time = models.FloatField(help_text="Unix time at which the job emitted the event.")
    data = models.JSONField(default=dict)

    class Meta:
        ordering = ["job", "seq"]
        constraints = [models.UniqueConstraint(fields=["job", "seq"], name="event_unique_seq")]
        indexes = [models.Index(fields=["job", "type", "seq"], name="event_job_type_seq")]

    def __str__(self) -> str:
        return f"job {self.job_id} #{self.seq} {self.type}"

    def as_message(self) -> dict[str, Any]:
        """The event as it goes over the wire (REST, websocket): the stored fields, nothing derived."""
        return {"seq": self.seq, "type": self.type, "step": self.step, "time": self.time, "data": self.data}


class JobNote(models.Model):
    """A team's tags and notes on one of its jobs ("lr sweep", "baseline"; what was tried and why): the job
    list filters by tag. Kept beside the job, not in it: the job row is the worker's record of the run."""

    MAX_TAGS = 10
    MAX_TAG_LENGTH = 30

    job = models.OneToOneField("jobs.TrainingJob", on_delete=models.CASCADE, related_name="note")
    tags = models.JSONField(default=list, blank=True)
    notes = models.TextField(blank=True, max_length=5000)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"job {self.job_id}: {', '.join(self.tags)}"
