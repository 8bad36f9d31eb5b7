"""REST API of sweeps: launch one (every run or none), list a team's, read one with its runs and best run."""

from __future__ import annotations

from typing import Any, cast

from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.request import Request
from rest_framework.response import Response

from webapp.accounts.models import Team
from webapp.jobs.actions import QuotaExceeded
from webapp.jobs.models import TrainingJob
from webapp.schema import detail_response
from webapp.sweeps import actions
from webapp.sweeps.models import Goal, Kind, Sweep


class SweepRunSerializer(serializers.Serializer[Any]):
    job = serializers.IntegerField(help_text="The run's job id.")
    status = serializers.CharField()
    params = serializers.DictField(help_text="The values of the swept fields this run got.")
    value = serializers.FloatField(allow_null=True, help_text="Its value of the sweep's metric (final, else latest).")


class SweepSerializer(serializers.ModelSerializer[Sweep]):
    team: serializers.SlugRelatedField[Team] = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    runs = serializers.SerializerMethodField()
    best = serializers.SerializerMethodField(help_text="The job id of the best run by the metric, or null.")

    class Meta:
        model = Sweep
        fields = ["id", "team", "name", "kind", "space", "count", "seed", "metric", "goal", "base_job", "created_at",
                  "runs", "best"]

    def _values(self, sweep: Sweep) -> dict[int, float | None]:
        cache = cast(dict[str, Any], self.context).setdefault("values", {})  # the serializer's own dict
        if sweep.pk not in cache:
            cache[sweep.pk] = {r.job_id: actions.run_value(r.job, sweep.metric) for r in sweep.runs.all()}
        return cache[sweep.pk]  # type: ignore[no-any-return]

    @extend_schema_field(SweepRunSerializer(many=True))
    def get_runs(self, sweep: Sweep) -> list[dict[str, Any]]:
        values = self._values(sweep)
        return [{"job": r.job_id, "status": r.job.status, "params": r.params, "value": values[r.job_id]}
                for r in sweep.runs.all()]

    def get_best(self, sweep: Sweep) -> int | None:
        return actions.best_run(self._values(sweep), sweep.goal)


class SweepLaunchSerializer(serializers.Serializer[Any]):
    base_job = serializers.IntegerField(help_text="A job of your team whose launch settings every run starts from.")
    name = serializers.CharField(max_length=80)
    kind = serializers.ChoiceField(choices=Kind.choices, default=Kind.GRID)
    # The API's name for the swept fields. DRF's metaclass moves a declared field into _declared_fields, so it
    # does not hide Serializer.fields, as the stubs suppose.
    fields = serializers.DictField(  # type: ignore[assignment]
        help_text='The launch fields to sweep and their values: {"learning_rate": [1e-4, 3e-4], "seed": [0, 1]}; '
                  'a random sweep also takes ranges: {"learning_rate": {"min": 1e-5, "max": 1e-3, "log": true}}.')
    count = serializers.IntegerField(min_value=0, max_value=1000, default=0, help_text="random: how many runs.")
    seed = serializers.IntegerField(min_value=0, max_value=2**31 - 1, default=0, help_text="random: the draws' seed.")
    metric = serializers.CharField(max_length=100, default="eval/accuracy",
                                   help_text="The metric the best run is chosen by.")
    goal = serializers.ChoiceField(choices=Goal.choices, default=Goal.MAX)


class SweepViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet[Sweep]):
    serializer_class = SweepSerializer
    lookup_value_regex = r"\d+"
    queryset = Sweep.objects.none()

    @property
    def throttle_scope(self) -> str | None:
        return "launch" if getattr(self, "action", None) == "create" else None

    def get_queryset(self) -> Any:
        if getattr(self, "swagger_fake_view", False):
            return Sweep.objects.none()
        return Sweep.objects.visible_to(self.request.user).select_related("team").prefetch_related("runs__job")

    # A 400 is the validation shape every operation documents (messages by field, or "detail" for a bad space
    # or a run the launch rules refuse, naming it): webapp.schema adds it.
    @extend_schema(request=SweepLaunchSerializer, responses={
        201: SweepSerializer, 403: detail_response("The runs do not fit the team's concurrent-jobs quota.")})
    def create(self, request: Request) -> Response:
        """Launch a grid or random sweep as one group of queued jobs, every run or none."""
        ser = SweepLaunchSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        d = ser.validated_data
        base = TrainingJob.objects.visible_to(request.user).select_related("team").filter(pk=d["base_job"]).first()
        if base is None:
            return Response({"base_job": ["Not one of your teams' jobs."]}, status=status.HTTP_400_BAD_REQUEST)
        try:
            sweep = actions.do_launch_sweep(user=request.user, base=base, name=d["name"], kind=d["kind"],
                                            space=d["fields"], count=d["count"], seed=d["seed"], metric=d["metric"],
                                            goal=d["goal"])
        except actions.SweepRefused as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_400_BAD_REQUEST)
        except QuotaExceeded as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_403_FORBIDDEN)
        return Response(SweepSerializer(sweep).data, status=status.HTTP_201_CREATED)
