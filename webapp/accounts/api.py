"""The API's token endpoint: DRF's ``obtain_auth_token``, throttled and under django-axes' login lockout."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from rest_framework.authtoken.views import ObtainAuthToken
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from webapp.accounts.throttling import ScopedThrottle


class ObtainTokenView(ObtainAuthToken):
    """Exchange a username and password for the API token (``Authorization: Token <key>``).

    Limited to ``AGENTFLY_RATE_TOKEN`` requests per address. After ``AGENTFLY_LOGIN_FAILURE_LIMIT`` wrong
    passwords for one username from one address, that pair is refused with 429 for
    ``AGENTFLY_LOGIN_COOLOFF_MINUTES``: the same lock as the sign-in page's.
    """

    # DRF's own ObtainAuthToken sets throttle_classes = (): without these, guessing would be unlimited.

    throttle_classes = [ScopedThrottle]
    throttle_scope = "token"

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
