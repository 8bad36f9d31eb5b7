"""REST API of the registry: list, register (queued for inspection on a worker), try a tool."""

from __future__ import annotations

from typing import Any, cast

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from webapp.accounts.api import MemberTeamField
from webapp.accounts.models import Team
from webapp.registry import actions
from webapp.registry.models import Entry, Kind, Version, check_import_path
from webapp.registry.rules import NotRegistrable, check_registrable
from webapp.registry.trying import NoAnswer, TooManyTries, charged_team, not_triable, try_on_worker
from webapp.schema import detail_response


class VersionSerializer(serializers.ModelSerializer[Version]):
    class Meta:
        model = Version
        fields = ["id", "source_hash", "name", "signature", "docstring", "schema", "resource", "created_at"]


class EntrySerializer(serializers.ModelSerializer[Entry]):
    # null for a built-in entry (no team) and for one whose inspection has not succeeded yet (no version)
    team: serializers.SlugRelatedField[Team] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True, allow_null=True)
    current_version = VersionSerializer(read_only=True, allow_null=True)

    class Meta:
        model = Entry
        fields = ["id", "kind", "team", "import_path", "name", "status", "error", "current_version",
                  "created_at", "inspected_at"]


class RegisterSerializer(serializers.Serializer[Any]):
    kind = serializers.ChoiceField(choices=Kind.choices)
    import_path = serializers.CharField(max_length=300)
    team = MemberTeamField()

    def validate_import_path(self, value: str) -> str:
        try:
            return check_import_path(value)
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from None

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        try:
            check_registrable(attrs["kind"], attrs["import_path"], attrs["team"].slug)
        except NotRegistrable as exc:
            raise serializers.ValidationError({"import_path": [str(exc)]}) from None
        return attrs


class TrySerializer(serializers.Serializer[Any]):
    arguments = serializers.DictField(help_text="The tool's arguments, as the model would send them.")


class TryResultSerializer(serializers.Serializer[Any]):
    """What one call of the tool gave: its observation, or the error the model would have been shown."""

    observation = serializers.CharField(allow_blank=True, help_text="The tool's output as the model sees it.")
    error = serializers.CharField(allow_null=True, allow_blank=True, help_text="Why the call failed, or null.")
    latency = serializers.FloatField(help_text="Seconds the call took on the worker.")


@extend_schema_view(list=extend_schema(parameters=[
    OpenApiParameter("kind", str, enum=Kind.values, description="Only tools or only rewards."),
]))
class EntryViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet[Entry]):
    serializer_class = EntrySerializer
    lookup_value_regex = r"\d+"

    queryset = Entry.objects.none()  # the schema generator's hint; requests use get_queryset

    @property
    def throttle_scope(self) -> str | None:
        # "Try it" runs code on a worker: a rate of its own per user (AGENTFLY_RATE_TRY), one budget with the
        # registry page's button.
        return "try" if getattr(self, "action", None) == "try_it" else None

    def get_queryset(self) -> Any:
        if getattr(self, "swagger_fake_view", False):
            return Entry.objects.none()
        qs = Entry.objects.visible_to(self.request.user).select_related("team", "current_version")
        kind = self.request.query_params.get("kind")
        if kind:
            if kind not in Kind.values:
                raise serializers.ValidationError({"kind": f"Unknown kind {kind!r}; use 'tool' or 'reward'."})
            qs = qs.filter(kind=kind)
        return qs

    @extend_schema(request=RegisterSerializer, responses={202: EntrySerializer})
    def create(self, request: Request) -> Response:
        """Register a tool or reward by import path; a worker imports and describes it."""
        ser = RegisterSerializer(data=request.data, context={"request": request})
        ser.is_valid(raise_exception=True)
        entry = actions.do_register_entry(user=request.user, **ser.validated_data)
        return Response(EntrySerializer(entry).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=TrySerializer, responses={
        200: TryResultSerializer,
        400: OpenApiResponse(description="Bad arguments, or the entry is a reward (``detail`` says which)."),
        409: detail_response("The tool is not ready (pending or failed inspection)."),
        429: detail_response("The user already has AGENTFLY_TRY_CONCURRENCY calls running."),
        504: detail_response("No worker on the try queue answered within AGENTFLY_TRY_TIMEOUT."),
    })
    @action(detail=True, methods=["post"], url_path="try")
    def try_it(self, request: Request, pk: str | None = None) -> Response:
        """Call a ready tool with arguments on a worker and return its observation."""
        entry = self.get_object()
        if entry.kind != Kind.TOOL:
            return Response({"detail": "Only tools can be tried; this entry is a reward."}, status=400)
        why = not_triable("This tool", entry.status, entry.current_version is not None)
        if why:
            return Response({"detail": why}, status=409)
        ser = TrySerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        try:
            return Response(try_on_worker(cast(int, request.user.pk), entry.pk,  # signed in (IsAuthenticated)
                                          ser.validated_data["arguments"],
                                          team_id=charged_team(entry, request.user)))
        except TooManyTries as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_429_TOO_MANY_REQUESTS)
        except NoAnswer as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_504_GATEWAY_TIMEOUT)
