"""The API's token endpoint (throttled, under django-axes' login lockout) and team invitations."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.urls import reverse
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.authtoken.views import ObtainAuthToken
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from webapp.accounts.models import (
    Invitation,
    InvitationRefused,
    MembershipInvitation,
    NotTeamAdmin,
    Team,
    do_answer_invitation,
    do_create_invitation,
    do_invite_member,
    do_revoke_invitation,
)
from webapp.accounts.throttling import ScopedThrottle
from webapp.inputs import SafeFormParser, SafeJSONParser, SafeMultiPartParser

if TYPE_CHECKING:
    from django.contrib.auth.models import User


class ObtainTokenView(ObtainAuthToken):
    """Exchange a username and password for the API token (``Authorization: Token <key>``).

    Limited to ``AGENTFLY_RATE_TOKEN`` requests per address. After ``AGENTFLY_LOGIN_FAILURE_LIMIT`` wrong
    passwords for one username from one address, that pair is refused with 429 for
    ``AGENTFLY_LOGIN_COOLOFF_MINUTES``: the same lock as the sign-in page's.
    """

    # DRF's own ObtainAuthToken sets throttle_classes = (): without these, guessing would be unlimited.

    throttle_classes = [ScopedThrottle]
    throttle_scope = "token"
    # DRF's token view names its own parsers; give it the app's (depth and text checks) too.
    parser_classes = [SafeFormParser, SafeMultiPartParser, SafeJSONParser]

    def post(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        try:
            return super().post(request, *args, **kwargs)
        except ValidationError:
            # axes flags the request it saw in authenticate(); DRF would otherwise answer a plain
            # "Unable to log in", and the caller could not tell a lock from a typo.
            if getattr(request, "axes_locked_out", False):
                seconds = int(settings.AXES_COOLOFF_TIME.total_seconds())
                return Response({"detail": f"Too many failed sign-ins for this username from your address "
                                           f"(AGENTFLY_LOGIN_FAILURE_LIMIT={settings.AXES_FAILURE_LIMIT}); try "
                                           f"again in {max(1, round(seconds / 60))} minutes."},
                                status=429, headers={"Retry-After": str(seconds)})
            raise


obtain_token = ObtainTokenView.as_view()


class InvitationSerializer(serializers.ModelSerializer[Invitation]):
    team: serializers.SlugRelatedField[Team] = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    created_by: serializers.SlugRelatedField[User] = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True)
    used_by: serializers.SlugRelatedField[User] = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True)
    state = serializers.ChoiceField(choices=["pending", "used", "revoked", "expired"], read_only=True)

    class Meta:
        model = Invitation
        fields = ["id", "team", "state", "created_by", "created_at", "expires_at", "used_by", "used_at", "revoked_at"]


class NewInvitationSerializer(InvitationSerializer):
    link = serializers.URLField(read_only=True, help_text="The sign-up link; shown only in this response.")

    class Meta(InvitationSerializer.Meta):
        fields = [*InvitationSerializer.Meta.fields, "link"]


NOT_YOUR_TEAM = ("No team of yours has the slug {slug!r}: it does not exist or you are not a member. Your teams "
                 "are listed at /accounts/teams/.")


class MemberTeamField(serializers.SlugRelatedField[Team]):
    """A team named by its slug, among the caller's teams only.

    Another team's slug and a slug no team has get the same answer, so the API never tells whether a team
    exists.
    """

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("help_text", "Slug of one of your teams.")
        super().__init__(slug_field="slug", queryset=Team.objects.none(), **kwargs)

    def get_queryset(self) -> Any:
        return Team.objects.of(getattr(self.context.get("request"), "user", None))

    def to_internal_value(self, data: Any) -> Any:
        try:
            return super().to_internal_value(data)
        except serializers.ValidationError:
            raise serializers.ValidationError(NOT_YOUR_TEAM.format(slug=str(data)[:80])) from None


def not_admin(exc: NotTeamAdmin, what: str) -> Response:
    # DRF would answer Django's PermissionDenied with its generic text; the caller needs to know whom to ask.
    return Response({"detail": f"{what}: {exc}."}, status=status.HTTP_403_FORBIDDEN)


class CreateInvitationSerializer(serializers.Serializer[Any]):
    team = MemberTeamField()


class InvitationViewSet(mixins.ListModelMixin, viewsets.GenericViewSet[Invitation]):
    """Invitation links into your teams: create one, list them, revoke a pending one."""

    serializer_class = InvitationSerializer
    queryset = Invitation.objects.none()  # the schema generator's hint; requests use get_queryset

    def get_queryset(self) -> Any:
        if getattr(self, "swagger_fake_view", False):
            return Invitation.objects.none()
        return Invitation.objects.visible_to(self.request.user).select_related("team", "created_by", "used_by")

    @extend_schema(request=CreateInvitationSerializer, responses={
        201: NewInvitationSerializer,
        400: OpenApiResponse(description="The team is not one of yours."),
        403: OpenApiResponse(description="You are a member of the team but not one of its admins."),
        409: OpenApiResponse(description="Sign-up is closed on this server (AGENTFLY_SIGNUP=closed)."),
    })
    def create(self, request: Request) -> Response:
        ser = CreateInvitationSerializer(data=request.data, context={"request": request})
        ser.is_valid(raise_exception=True)
        try:
            invitation, token = do_create_invitation(ser.validated_data["team"], request.user)
        except NotTeamAdmin as exc:
            return not_admin(exc, "No invitation was created")
        except InvitationRefused as exc:
            return Response({"detail": f"No invitation was created: {exc}."}, status=status.HTTP_409_CONFLICT)
        data = NewInvitationSerializer(invitation).data
        data["link"] = request.build_absolute_uri(reverse("accounts:signup_invited", args=[token]))
        return Response(data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={
        200: InvitationSerializer,
        403: OpenApiResponse(description="You are a member of the team but not one of its admins."),
    })
    @action(detail=True, methods=["post"])
    def revoke(self, request: Request, pk: str | None = None) -> Response:
        """Revoke a pending invitation (idempotent; a used or expired one stays as it is). Team admins only."""
        try:
            return Response(InvitationSerializer(do_revoke_invitation(self.get_object(), request.user)).data)
        except NotTeamAdmin as exc:
            return not_admin(exc, "The invitation was not revoked")


class MembershipInvitationSerializer(serializers.ModelSerializer[MembershipInvitation]):
    team: serializers.SlugRelatedField[Team] = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    invitee = serializers.CharField(source="invitee_name", read_only=True,
                                    help_text="The username the invitation was made for.")
    invited_by: serializers.SlugRelatedField[User] = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True)
    state = serializers.ChoiceField(choices=["pending", "accepted", "declined"], read_only=True)

    class Meta:
        model = MembershipInvitation
        fields = ["id", "team", "invitee", "invited_by", "state", "created_at", "answered_at"]


class InviteMemberSerializer(CreateInvitationSerializer):
    username = serializers.CharField(max_length=150, help_text="The existing user to invite.")


class MembershipInvitationViewSet(mixins.ListModelMixin, viewsets.GenericViewSet[MembershipInvitation]):
    """Invitations of existing users into teams: a team admin invites, the invitee accepts or declines.

    Nobody joins a team without accepting: the list holds the invitations into your teams and those
    addressed to you; only the invitee may answer one.
    """

    serializer_class = MembershipInvitationSerializer
    queryset = MembershipInvitation.objects.none()

    def get_queryset(self) -> Any:
        if getattr(self, "swagger_fake_view", False):
            return MembershipInvitation.objects.none()
        return (MembershipInvitation.objects.of(self.request.user).distinct()
                .select_related("team", "invitee", "invited_by"))

    @extend_schema(request=InviteMemberSerializer, responses={
        201: MembershipInvitationSerializer,
        400: OpenApiResponse(description="The team is not one of yours."),
        403: OpenApiResponse(description="You are a member of the team but not one of its admins."),
        409: OpenApiResponse(description="They are already a member (a username no one has is invited like any "
                                         "other, and never answers)."),
    })
    def create(self, request: Request) -> Response:
        ser = InviteMemberSerializer(data=request.data, context={"request": request})
        ser.is_valid(raise_exception=True)
        try:
            invitation = do_invite_member(ser.validated_data["team"], request.user, ser.validated_data["username"])
        except NotTeamAdmin as exc:
            return not_admin(exc, "No invitation was created")
        except InvitationRefused as exc:
            return Response({"detail": f"No invitation was created: {exc}."}, status=status.HTTP_409_CONFLICT)
        return Response(MembershipInvitationSerializer(invitation).data, status=status.HTTP_201_CREATED)

    def _answer(self, request: Request, accept: bool) -> Response:
        # Only the invitee's own invitations resolve here: a team member answering for them reads as not found.
        invitation = self.get_object()
        if invitation.invitee_id != request.user.pk:
            from rest_framework.exceptions import NotFound

            raise NotFound("No invitation to you has this id.")
        try:
            invitation = do_answer_invitation(invitation, request.user, accept=accept)
        except InvitationRefused as exc:
            return Response({"detail": f"{exc}."}, status=status.HTTP_409_CONFLICT)
        return Response(MembershipInvitationSerializer(invitation).data)

    @extend_schema(request=None, responses={200: MembershipInvitationSerializer,
                                            409: OpenApiResponse(description="Already answered.")})
    @action(detail=True, methods=["post"])
    def accept(self, request: Request, pk: str | None = None) -> Response:
        """Accept an invitation addressed to you: you join its team."""
        return self._answer(request, True)

    @extend_schema(request=None, responses={200: MembershipInvitationSerializer,
                                            409: OpenApiResponse(description="Already answered.")})
    @action(detail=True, methods=["post"])
    def decline(self, request: Request, pk: str | None = None) -> Response:
        """Decline an invitation addressed to you."""
        return self._answer(request, False)
