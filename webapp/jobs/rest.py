"""REST API of jobs: launch (validated by the same form as the page), cancel, resume, events, checkpoints.

(``webapp.jobs.apis`` is another thing: the rate-limited web APIs a job's tools call, within its team's quota.)"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from webapp.accounts.models import Team
from webapp.inputs import PG_BIGINT_MAX, query_int
from webapp.jobs import actions, schema
from webapp.jobs.forms import JUDGE_SOURCES, MODEL_SOURCES, RUBRIC_MAX_CHARS, TASKS, LaunchForm
from webapp.jobs.models import APIQuota, Checkpoint, Kind, Queue, TrainingJob
from webapp.monitor.events import events_after, requested_types
from webapp.monitor.models import EventType
from webapp.schema import detail_response

if TYPE_CHECKING:
    from django.contrib.auth.models import User

    from webapp.registry.models import Version


class CheckpointSerializer(serializers.ModelSerializer[Checkpoint]):
    class Meta:
        model = Checkpoint
        fields = ["id", "step", "path", "metrics", "created_at"]


class JobSerializer(serializers.ModelSerializer[TrainingJob]):
    team: serializers.SlugRelatedField[Team] = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    # null once the user is deleted, for a job made without a reward version, and for a fresh (not resumed) job
    created_by: serializers.SlugRelatedField[User] = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True)
    tool_versions: serializers.SlugRelatedField[Version] = serializers.SlugRelatedField(
        slug_field="source_hash", many=True, read_only=True)
    reward_version: serializers.SlugRelatedField[Version] = serializers.SlugRelatedField(
        slug_field="source_hash", read_only=True, allow_null=True)
    resumed_from: serializers.PrimaryKeyRelatedField[Checkpoint] = serializers.PrimaryKeyRelatedField(
        read_only=True, allow_null=True)
    total_steps = serializers.IntegerField(read_only=True, help_text="The step the job trains to (config steps).")
    config = serializers.JSONField(source="launch_config", read_only=True,
                                   help_text="The trainer config, with ranks and nodes (when above 1) and resume_from.")

    class Meta:
        model = TrainingJob
        fields = ["id", "name", "team", "created_by", "kind", "status", "queue", "config", "tool_versions",
                  "reward_version", "resumed_from", "cancel_requested", "step", "total_steps", "final_metrics",
                  "error", "last_seq", "created_at", "started_at", "finished_at", "heartbeat_at"]


class EventSerializer(serializers.Serializer[Any]):
    seq = serializers.IntegerField()
    type = serializers.ChoiceField(choices=EventType.values)
    step = serializers.IntegerField(allow_null=True)
    time = serializers.FloatField(allow_null=True)
    # The wire name of an event's payload. DRF's metaclass moves a declared field into _declared_fields, so it
    # does not hide Serializer.data, as the stubs suppose.
    data = serializers.JSONField(  # type: ignore[assignment]
        help_text="The payload as the trainer emitted it (trainer/events.py).")


class EventPageSerializer(serializers.Serializer[Any]):
    job = serializers.IntegerField()
    last_seq = serializers.IntegerField()
    events = EventSerializer(many=True)


def bounded(kind: Any, name: str, default: float) -> Any:
    """A number field documented with the launch form's own bounds (the form validates; this is the schema)."""
    field = LaunchForm.base_fields[name]
    return kind(default=default, min_value=field.min_value, max_value=field.max_value)


# The settings trainer/config.py declares for the web app (``webapp.jobs.schema``), as API fields.
LaunchSettings = type("LaunchSettings", (serializers.Serializer,), schema.serializer_fields())


class LaunchSerializer(LaunchSettings):  # type: ignore[misc,valid-type]
    """The launch fields. Validation is ``LaunchForm``'s, so the page and the API share every rule."""

    name = serializers.CharField(max_length=100)
    team = serializers.CharField(help_text="Team slug.")
    kind = serializers.ChoiceField(
        choices=Kind.choices, default=Kind.RL,
        help_text="rl (RL with `algorithm`), sft (a supervised warm start; its model is the job's checkpoint) or "
                  "sft_then_rl (the warm start, then RL from its weights, RL's steps counted after the warm start's).")
    demos_path = serializers.CharField(
        required=False, allow_blank=True,
        help_text="sft, sft_then_rl: JSONL of written demonstrations (a task sample with its `messages` a line), in "
                  "the team's folder or AGENTFLY_ALLOWED_PATHS; empty generates them for the arithmetic task.")
    sft_habit = serializers.ChoiceField(
        choices=LaunchForm.base_fields["sft_habit"].choices, default="", required=False,
        help_text="sft, sft_then_rl with generated demonstrations: a demonstrator's bad habit for RL to undo, shown "
                  "on questions opening with `sft_habit_phrasings` (comma-separated), in `sft_habit_fraction` of them.")
    sft_habit_phrasings = serializers.CharField(required=False, allow_blank=True, default="")
    model_source = serializers.ChoiceField(choices=MODEL_SOURCES, default="tiny")
    model_path = serializers.CharField(required=False, allow_blank=True)
    task = serializers.ChoiceField(choices=TASKS, default="arithmetic")
    task_path = serializers.CharField(required=False, allow_blank=True)
    task_source = serializers.CharField(
        required=False, allow_blank=True,
        help_text="task=source: reasoning_gym:<dataset>, textworld:<theme> or agentfly_teams.<team>.<module>:<name>.")
    task_options = serializers.DictField(
        default=dict, help_text="task=source: the source's options, e.g. {\"max_terms\": 4} or {\"rooms\": [2, 4]}.")
    eval_path = serializers.CharField(required=False, allow_blank=True,
                                      help_text="JSONL of held-out samples; required for a JSONL task.")
    tools = serializers.ListField(child=serializers.IntegerField(), default=list, help_text="Registry entry ids.")
    mcp_tools = serializers.ListField(child=serializers.CharField(), default=list,
                                     help_text="Tools of the team's ready MCP servers the agent gets, each as "
                                               "<server id>/<tool name> (GET /api/mcp-servers/).")
    reward = serializers.IntegerField(help_text="Registry entry id.")
    resources = serializers.DictField(default=dict)
    queue = serializers.ChoiceField(choices=Queue.choices, default=Queue.CPU)
    gpus = bounded(serializers.IntegerField, "gpus", 1)
    nodes = bounded(serializers.IntegerField, "nodes", 1)
    launch_key = serializers.CharField(required=False, allow_blank=True, max_length=64)
    engine_servers = serializers.ListField(
        child=serializers.CharField(), default=list,
        help_text="Inference servers to roll out on (engine=remote), among AGENTFLY_INFERENCE_SERVERS for the team.")
    judge_source = serializers.ChoiceField(
        choices=[c for c, _ in JUDGE_SOURCES], default="",
        help_text="Where the judge of a judge reward runs: '' (no judge), policy (the job's starting model, a "
                  "frozen copy), path (judge_model_path) or server (judge_server).")
    judge_model_path = serializers.CharField(required=False, allow_blank=True,
                                             help_text="judge_source=path: the judge model's directory.")
    judge_server = serializers.CharField(required=False, allow_blank=True,
                                         help_text="judge_source=server: a base URL among AGENTFLY_JUDGE_SERVERS for "
                                                   "the team.")
    judge_rubric = serializers.CharField(
        required=False, allow_blank=True,
        help_text=f"What the judge grades on when a sample has no rubric (at most {RUBRIC_MAX_CHARS} characters).")
    reward_model_path = serializers.CharField(
        required=False, allow_blank=True,
        help_text="For a reward declared with @reward(resource=\"reward_model\"): a sequence-classification model "
                  "directory, loaded in the worker.")


def launch_form(request: Request) -> LaunchForm:
    """Turn API JSON into the launch form's data, refusing fields the API does not know."""
    data = request.data
    if not isinstance(data, dict):
        raise serializers.ValidationError({"non_field_errors": ["Send a JSON object."]})
    unknown = sorted(set(data) - set(LaunchSerializer().fields))
    if unknown:
        raise serializers.ValidationError({k: ["Unknown field."] for k in unknown})
    defaults = {name: f.default for name, f in LaunchSerializer().fields.items()
                if f.default is not serializers.empty}
    merged: dict[str, Any] = {**{k: (v() if callable(v) else v) for k, v in defaults.items()}, **data}
    team = Team.objects.of(request.user).filter(slug=str(merged.get("team", ""))).first()
    merged["team"] = team.pk if team else f"unknown team {merged.get('team')!r}"
    if not isinstance(merged.get("tools"), list):
        raise serializers.ValidationError({"tools": ["Give a list of registry entry ids."]})
    if not isinstance(merged.get("mcp_tools"), list):
        raise serializers.ValidationError({"mcp_tools": ["Give a list of <server id>/<tool name> strings."]})
    if not isinstance(merged.get("resources"), dict):
        raise serializers.ValidationError({"resources": ['Give an object like {"python": {"max": 4}}.']})
    merged["resources"] = json.dumps(merged["resources"])
    if not isinstance(merged.get("task_options"), dict):
        raise serializers.ValidationError({"task_options": ['Give an object like {"max_terms": 4}.']})
    merged["task_options"] = json.dumps(merged["task_options"]) if merged["task_options"] else ""
    if not isinstance(merged.get("engine_servers"), list):
        raise serializers.ValidationError({"engine_servers": ["Give a list of server URLs."]})
    merged["engine_servers"] = ", ".join(str(u) for u in merged["engine_servers"])
    merged["launch_key"] = merged.get("launch_key") or request.headers.get("Idempotency-Key", "")
    return LaunchForm(merged, user=request.user)


class JobViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet[TrainingJob]):
    serializer_class = JobSerializer
    lookup_value_regex = r"\d+"

    queryset = TrainingJob.objects.none()  # the schema generator's hint; requests use get_queryset

    @property
    def throttle_scope(self) -> str | None:
        # Launching and resuming queue work on a GPU or CPU worker: their own rate per user
        # (AGENTFLY_RATE_LAUNCH), one budget with the launch page.
        return "launch" if getattr(self, "action", None) in {"create", "resume"} else None

    def get_queryset(self) -> Any:
        if getattr(self, "swagger_fake_view", False):  # drf-spectacular building the schema
            return TrainingJob.objects.none()
        return TrainingJob.objects.visible_to(self.request.user).select_related("team", "created_by")

    @extend_schema(request=LaunchSerializer, responses={201: JobSerializer, 200: JobSerializer})
    def create(self, request: Request) -> Response:
        """Launch a job. With ``launch_key`` (or an ``Idempotency-Key`` header) a repeat returns the same job."""
        form = launch_form(request)
        if not form.is_valid():
            return Response(form.errors.get_json_data(), status=status.HTTP_400_BAD_REQUEST)
        try:
            job, created = form.launch(request.user)
        except actions.QuotaExceeded as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_403_FORBIDDEN)
        return Response(JobSerializer(job).data, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    @extend_schema(request=None, responses={200: JobSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        """Cancel the job (idempotent)."""
        return Response(JobSerializer(actions.do_cancel_job(self.get_object())).data)

    @extend_schema(request=None, responses={201: JobSerializer, 200: JobSerializer,
                                            409: detail_response("The job has no checkpoint to resume from.")})
    @action(detail=True, methods=["post"])
    def resume(self, request: Request, pk: str | None = None) -> Response:
        """Start a job that continues this one from its last checkpoint (idempotent)."""
        try:
            job, created = actions.do_resume_job(user=request.user, job=self.get_object())
        except actions.NotResumable as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        except actions.QuotaExceeded as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_403_FORBIDDEN)
        return Response(JobSerializer(job).data, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    @extend_schema(parameters=[
        OpenApiParameter("after", {"type": "integer", "format": "int64", "minimum": 0, "maximum": PG_BIGINT_MAX},
                         description="Only events with a larger sequence number."),
        OpenApiParameter("types", str, many=True, enum=EventType.values,
                         description="Only these types (comma-separated or repeated; `type=` is a deprecated alias)."),
        OpenApiParameter("limit", {"type": "integer", "minimum": 1, "maximum": 5000},
                         description="At most this many (1-5000)."),
    ], responses={200: EventPageSerializer})
    @action(detail=True, methods=["get"])
    def events(self, request: Request, pk: str | None = None) -> Response:
        """The job's stored events in sequence order."""
        job = self.get_object()
        errors: dict[str, list[str]] = {}
        try:
            after = query_int(request.query_params, "after", 0, 0, PG_BIGINT_MAX)
        except ValueError:
            errors["after"] = ["Give a sequence number (an integer >= 0)."]
            after = 0
        try:
            limit = query_int(request.query_params, "limit", 1000, 1, 5000)
        except ValueError:
            errors["limit"] = ["Give an integer from 1 to 5000."]
            limit = 1000
        types = requested_types(request.query_params)
        bad = [t for t in types if t not in EventType.values]
        if bad:  # named after the parameter the client used (`type=` is the deprecated spelling)
            errors["types" if "types" in request.query_params else "type"] = [f"Unknown event type {t!r}; use one of {EventType.values}." for t in bad]
        if errors:
            return Response(errors, status=status.HTTP_400_BAD_REQUEST)
        return Response({"job": job.pk, "last_seq": job.last_seq,
                         "events": events_after(job.pk, after, types or None, limit)})

    @extend_schema(responses={200: CheckpointSerializer(many=True)})
    @action(detail=True, methods=["get"], pagination_class=None)  # all of them, a plain list (never paged)
    def checkpoints(self, request: Request, pk: str | None = None) -> Response:
        return Response(CheckpointSerializer(self.get_object().checkpoints.all(), many=True).data)


class APIQuotaSerializer(serializers.ModelSerializer[APIQuota]):
    team: serializers.SlugRelatedField[Team] = serializers.SlugRelatedField(slug_field="slug", read_only=True)

    class Meta:
        model = APIQuota
        fields = ["id", "team", "api", "rate", "burst", "concurrency", "daily_quota", "updated_at"]


class APIQuotaViewSet(mixins.ListModelMixin, viewsets.GenericViewSet[APIQuota]):
    """The operator's limits on each rate-limited API, for the caller's teams: what a job's
    ``resources.<api>.api`` may ask for at most. Read-only: an operator sets them in the admin."""

    serializer_class = APIQuotaSerializer
    queryset = APIQuota.objects.none()  # the schema generator's hint; requests use get_queryset

    def get_queryset(self) -> Any:
        if getattr(self, "swagger_fake_view", False):
            return APIQuota.objects.none()
        return APIQuota.objects.filter(team__in=Team.objects.of(self.request.user)).select_related("team")
