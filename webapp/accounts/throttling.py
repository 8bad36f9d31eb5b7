"""Rate limits: DRF's throttles for the API, and the very same throttles in front of the HTML views.

One counter per scope and user (or address, for anonymous requests) lives in Django's cache (Redis), so
the "try it" button and ``POST /api/registry/<id>/try/`` draw on one budget, across every web process.
The rates are ``settings.AGENTFLY_RATES`` (``REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]``); docs/security.md
lists them with the environment variables that set them.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from types import SimpleNamespace
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from rest_framework.settings import api_settings
from rest_framework.throttling import AnonRateThrottle, BaseThrottle, ScopedRateThrottle, UserRateThrottle

# What each scope limits, for the refusal message, and the variable that sets its rate.
SCOPES = {
    "anon": ("anonymous API requests", "AGENTFLY_RATE_ANON"),
    "user": ("API requests", "AGENTFLY_RATE_USER"),
    "token": ("token requests", "AGENTFLY_RATE_TOKEN"),
    "signup": ("sign-ups from your address", "AGENTFLY_RATE_SIGNUP"),
    "try": ('"try it" calls', "AGENTFLY_RATE_TRY"),
    "launch": ("job launches", "AGENTFLY_RATE_LAUNCH"),
    "team": ("new teams", "AGENTFLY_RATE_TEAM"),
}


class _LiveRates:
    """Read the rates when a request comes, not at import.

    DRF copies ``DEFAULT_THROTTLE_RATES`` into a class attribute when ``rest_framework.throttling`` is
    imported, so a changed setting (a test's override, ``api_settings.reload()``) would never be seen.
    """

    @property
    def THROTTLE_RATES(self) -> dict[str, str | None]:  # the name DRF reads
        return api_settings.DEFAULT_THROTTLE_RATES  # type: ignore[return-value]  # rates are strings like "5/min"


class AnonThrottle(_LiveRates, AnonRateThrottle):  # type: ignore[override]  # a read-only property, on purpose
    pass


class UserThrottle(_LiveRates, UserRateThrottle):  # type: ignore[override]  # as above
    pass


class ScopedThrottle(_LiveRates, ScopedRateThrottle):  # type: ignore[override]  # as above
    """Applies where a view names a ``throttle_scope`` (token, try, launch, signup); a no-op elsewhere."""


def client_ip(request: HttpRequest) -> str:
    """The client's address as the throttles see it (``AGENTFLY_NUM_PROXIES``); django-axes uses it too."""
    return BaseThrottle().get_ident(request)  # type: ignore[arg-type]


def too_many_requests(request: HttpRequest, scope: str, wait: float | None) -> HttpResponse:
    what, setting = SCOPES.get(scope, ("requests", ""))
    seconds = max(1, round(wait or 1))
    context = {"what": what, "rate": api_settings.DEFAULT_THROTTLE_RATES.get(scope, ""), "setting": setting,
               "seconds": seconds}
    template = "_too_many_requests.html" if request.headers.get("HX-Request") else "429.html"
    response = render(request, template, context, status=429)
    response["Retry-After"] = str(seconds)
    return response


def throttle(scope: str) -> Callable[[Callable[..., HttpResponse]], Callable[..., HttpResponse]]:
    """Refuse a view's POSTs beyond the ``scope``'s rate with a 429 page; GETs (showing the form) are free.

    Put it under ``@login_required`` so a signed-in user is counted by account, not by address.
    """

    def decorator(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if request.method == "POST":
                limiter = ScopedThrottle()
                if not limiter.allow_request(request, SimpleNamespace(throttle_scope=scope)):  # type: ignore[arg-type]
                    return too_many_requests(request, scope, limiter.wait())
            return view(request, *args, **kwargs)

        return wrapper

    return decorator
