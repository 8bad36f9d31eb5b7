"""A sweep and its runs: which job each run is and which values of the swept fields it got."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from webapp.accounts.models import Team, TeamOwnedQuerySet


class Kind(models.TextChoices):
    GRID = "grid", "grid (every combination)"
    RANDOM = "random", "random (count draws)"


class Goal(models.TextChoices):
    MAX = "max", "higher is better"
    MIN = "min", "lower is better"


class SweepQuerySet(TeamOwnedQuerySet["Sweep"]):
    pass


class Sweep(models.Model):
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="sweeps")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    name = models.CharField(max_length=80)
    kind = models.CharField(max_length=6, choices=Kind.choices)
    space = models.JSONField(help_text="The swept launch fields and their values as given: a list of values (grid "
                                       "or random), or {min, max, log, integer} (random).")
    count = models.PositiveIntegerField(default=0, help_text="random: how many runs were drawn.")
    seed = models.PositiveIntegerField(default=0, help_text="random: the draws' seed, so a sweep can be repeated.")
    metric = models.CharField(max_length=100, default="eval/accuracy",
                              help_text="The metric the best run is chosen by.")
    goal = models.CharField(max_length=3, choices=Goal.choices, default=Goal.MAX)
    base_job = models.ForeignKey("jobs.TrainingJob", null=True, on_delete=models.SET_NULL, related_name="+",
                                 help_text="The job whose launch settings every run starts from.")
    created_at = models.DateTimeField(auto_now_add=True)

    objects = SweepQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"sweep {self.name}"

    def get_absolute_url(self) -> str:
        return f"/sweeps/{self.pk}/"

    @property
    def fields(self) -> list[str]:
        return list(self.space)


class SweepRun(models.Model):
    sweep = models.ForeignKey(Sweep, on_delete=models.CASCADE, related_name="runs")
    job = models.OneToOneField("jobs.TrainingJob", on_delete=models.CASCADE, related_name="sweep_run")
    params = models.JSONField(help_text="The values of the swept fields this run got.")

    class Meta:
        ordering = ["pk"]
