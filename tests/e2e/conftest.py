"""Browser tests: Debian's Chromium driven by Playwright against Daphne and the real worker.

The web app's fixtures come from ``tests/webapp/fixtures.py`` (loaded for every test package); the monitoring
fixtures (a private channel layer per test, alice's job, session cookies) from ``tests/webapp/monitor/``.
``watch_for_problems`` is every browser test's problem watcher.
"""

from __future__ import annotations

from typing import Any

from tests.webapp.monitor.fixtures import alice_cookie, alice_job, bob_cookie, private_channel_layer  # noqa: F401


def watch_for_problems(page: Any, base: str = "") -> list[str]:
    """Collect console errors, page errors, failed requests and error responses, as they happen.

    A request the page itself gave up because it navigated away (a form's submit while the favicon or a
    preload was still loading) fails with ``net::ERR_ABORTED``: that is the browser's housekeeping, not a
    failure of the app, and is left out. It is told apart by order: a navigation of the main frame began
    after the request did. The same error with no navigation since (a request the server cut) still counts.
    """
    problems: list[str] = []
    navigations = [0]  # main-frame navigation requests seen so far
    issued_at: dict[Any, int] = {}  # request -> navigations seen when it was made

    def on_request(request: Any) -> None:
        issued_at[request] = navigations[0]
        if request.is_navigation_request() and request.frame == page.main_frame:
            navigations[0] += 1

    def on_failed(request: Any) -> None:
        failure = request.failure or ""
        aborted_by_navigation = "ERR_ABORTED" in failure and navigations[0] > issued_at.get(request, navigations[0])
        # (The navigation request itself is counted when issued, so an aborted navigation superseded by a newer one
        # is left out too, and a lone one that fails is not.)
        if not aborted_by_navigation:
            problems.append(f"request failed: {request.url} {failure}")

    page.on("request", on_request)
    page.on("requestfailed", on_failed)
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
    page.on("response", lambda r: problems.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None)
    return problems
