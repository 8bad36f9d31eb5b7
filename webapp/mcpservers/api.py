"""REST API of a team's MCP servers: list, register (inspected on a worker), try a tool. A team sees only its own."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from webapp.accounts.api import MemberTeamField
from webapp.accounts.models import Team
from webapp.mcpservers import actions
from webapp.mcpservers.models import MCPServer, MCPServerVersion, Transport
from webapp.mcpservers.rules import NotAllowed, check_url, stdio_argv
from webapp.registry.api import TryResultSerializer
from webapp.registry.trying import not_triable
from webapp.registry.tryslots import TooManyTries
from webapp.schema import detail_response


class MCPServerVersionSerializer(serializers.ModelSerializer[MCPServerVersion]):
    class Meta:
        model = MCPServerVersion
        fields = ["id", "listing_hash", "tools", "created_at"]


class MCPServerSerializer(serializers.ModelSerializer[MCPServer]):
    team: serializers.SlugRelatedField[Team] = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    current_version = MCPServerVersionSerializer(read_only=True, allow_null=True)

    class Meta:
        model = MCPServer
        fields = ["id", "team", "name", "transport", "command", "url", "reset_tool", "seed_tool", "status", "error",
                  "current_version", "created_at", "inspected_at"]


class MCPRegisterSerializer(serializers.Serializer[Any]):
    team = MemberTeamField()
    name = serializers.SlugField(max_length=60)
    transport = serializers.ChoiceField(choices=Transport.choices)
    command = serializers.ListField(child=serializers.CharField(max_length=500, trim_whitespace=False),
                                    required=False, max_length=32)
    url = serializers.CharField(max_length=500, required=False, allow_blank=True)
    reset_tool = serializers.RegexField(r"^[A-Za-z_][\w.-]{0,63}$", required=False, allow_blank=True, default="",
                                        help_text="A tool that forgets a session's state (called between rollouts).")
    seed_tool = serializers.RegexField(r"^[A-Za-z_][\w.-]{0,63}$", required=False, allow_blank=True, default="",
                                       help_text="A tool called at a rollout's first call with the sample's fields "
                                                 "its input schema names.")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        try:
            if attrs["transport"] == Transport.STDIO:
                stdio_argv(attrs["team"].slug, list(attrs.get("command") or []))
            else:
                check_url(attrs.get("url") or "")
        except NotAllowed as exc:
            field = "command" if attrs["transport"] == Transport.STDIO else "url"
            raise serializers.ValidationError({field: [str(exc)]}) from None
        return attrs


class MCPTrySerializer(serializers.Serializer[Any]):
    tool = serializers.CharField(max_length=64)
    arguments = serializers.DictField(required=False, default=dict)


class MCPServerViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet[MCPServer]):
    serializer_class = MCPServerSerializer
    lookup_value_regex = r"\d+"
    queryset = MCPServer.objects.none()

    @property
    def throttle_scope(self) -> str | None:
        return "try" if getattr(self, "action", None) == "try_it" else None

    def get_queryset(self) -> Any:
        if getattr(self, "swagger_fake_view", False):
            return MCPServer.objects.none()
        return MCPServer.objects.visible_to(self.request.user).select_related("team", "current_version")

    @extend_schema(request=MCPRegisterSerializer, responses={
        202: MCPServerSerializer,
        429: detail_response("The team's MCP inspections (AGENTFLY_MCP_INSPECT_TEAM_CONCURRENCY), or the "
                             "server's (AGENTFLY_MCP_INSPECT_POOL), are at their limit."),
    })
    def create(self, request: Request) -> Response:
        """Register a stdio or HTTP MCP server for a team; a worker lists its tools."""
        ser = MCPRegisterSerializer(data=request.data, context={"request": request})
        ser.is_valid(raise_exception=True)
        try:
            server = actions.do_register_server(user=request.user, **ser.validated_data)
        except actions.TooManyInspections as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_429_TOO_MANY_REQUESTS)
        return Response(MCPServerSerializer(server).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=MCPTrySerializer, responses={
        200: TryResultSerializer,
        400: OpenApiResponse(description="Bad arguments or an unknown tool."),
        409: detail_response("The server is not ready (pending or failed inspection)."),
        429: detail_response("The user already has AGENTFLY_TRY_CONCURRENCY calls running."),
        504: detail_response("No worker on the try queue answered within AGENTFLY_TRY_TIMEOUT."),
    })
    @action(detail=True, methods=["post"], url_path="try")
    def try_it(self, request: Request, pk: str | None = None) -> Response:
        """Call one of a ready server's tools on a worker and return what the model would read."""
        server = self.get_object()
        why = not_triable("This server", server.status, server.current_version is not None)
        if why:
            return Response({"detail": why}, status=409)
        ser = MCPTrySerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        names = [t["name"] for t in server.current_version.tools]  # type: ignore[union-attr]  # not_triable: it has one
        if ser.validated_data["tool"] not in names:
            return Response({"tool": [f"This server has no such tool; it has: {', '.join(names)}."]}, status=400)
        try:
            result = actions.do_try_tool(user=request.user, server=server, tool=ser.validated_data["tool"],
                                         arguments=ser.validated_data["arguments"])
        except TooManyTries as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_429_TOO_MANY_REQUESTS)
        except actions.NoAnswer as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_504_GATEWAY_TIMEOUT)
        return Response(result)
