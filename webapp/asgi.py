"""The ASGI entry point: HTTP goes to Django, websockets to the job dashboard's consumer (``webapp.jobs.consumers``).

Websockets authenticate through the session cookie (``AuthMiddlewareStack``) and must come from an allowed
origin, exactly (scheme, host and port: ``webapp.origin``), which is the websocket's equivalent of CSRF
protection.

    python -m webapp.serve -b 0.0.0.0 -p 8000 webapp.asgi:application   (Daphne, with the body limit)
"""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
# Django must be set up before anything imports models (the consumers do).
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from webapp.bodylimit import BodyLimitMiddleware  # noqa: E402
from webapp.jobs.routing import websocket_urlpatterns  # noqa: E402
from webapp.origin import ExactOriginValidator  # noqa: E402

application = ProtocolTypeRouter(
    {
        # Bodies over AGENTFLY_MAX_BODY_BYTES are refused before Django buffers them (webapp.bodylimit).
        "http": BodyLimitMiddleware(django_asgi_app),  # type: ignore[arg-type]  # the stubs' ASGIHandler is no ASGI app
        "websocket": ExactOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
