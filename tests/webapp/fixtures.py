"""Fixtures for the web app's tests: settings, personas, and a real Celery worker.

Django is configured here (not in a pytest.ini) so the library's tests never need it. The tests run against
the real PostgreSQL (``DATABASE_URL``, default ``postgres://postgres@127.0.0.1:5432/agentfly``) in a test
database of their own (or, with ``DATABASE_URL=sqlite:///FILE``, on the demo's SQLite settings in a file
beside ``FILE``, shared with the worker), and the real Redis (``REDIS_URL``, default database 13 so a developer's demo worker
on database 0 never steals a test's task). Personas: alice is in team A, bob in team B.

The ``worker`` fixture starts ``celery -A webapp worker`` as a subprocess against the test database, and
stops it after the session. Tests that need it must use ``transactional_db`` (the worker is another process
and sees only committed rows). Browser tests take ``daphne`` (the app served by a real Daphne) and
``browser_page`` (headless Debian Chromium driven by Playwright).

One test database, ``test_<name>_webapp``, serves every web-app test; two test sessions at once need two
``DATABASE_URL``s.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentfly.models.smollm2 import gguf_path

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
os.environ.setdefault("DEBUG", "1")
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/agentfly")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/13")
# A Redis namespace of this session's own (inherited by its workers and servers): two test sessions on one
# machine would otherwise consume each other's tasks and hear each other's job groups.
os.environ.setdefault("AGENTFLY_REDIS_PREFIX", f"agentfly-test-{uuid.uuid4().hex[:8]}:")
os.environ.setdefault("JOB_HEARTBEAT_SECONDS", "0.5")
os.environ.setdefault("JOB_HEARTBEAT_TIMEOUT", "6")
os.environ.setdefault("AGENTFLY_JOB_STOP_GRACE", "30")  # a job that does not yield is stopped 30 s after asked
os.environ.setdefault("AGENTFLY_TRY_TIMEOUT", "60")
# A hanging tool's child is killed after this many seconds (the tests wait for it).
os.environ.setdefault("AGENTFLY_CHILD_TIMEOUT", "5")
# Tests launch on the gpu queue so that no worker takes the job; the launch form's "is a GPU worker running?"
# check is turned on by the tests of that check.
os.environ.setdefault("AGENTFLY_CHECK_GPU_WORKERS", "0")
# Tests sign in and call the API far more often than a person: rates high enough never to get in their way.
# Each limit's own tests set a low one with the ``rate_limits`` fixture (tests/webapp/accounts/test_rate_limits.py).
for _scope in ("ANON", "USER", "TOKEN", "SIGNUP", "TRY", "LAUNCH"):
    os.environ.setdefault(f"AGENTFLY_RATE_{_scope}", "100000/hour")
PLUGINS = Path(__file__).parent / "plugins"
os.environ.setdefault("AGENTFLY_PLUGIN_DIRS", str(PLUGINS))
# Paths outside a team's folder are refused unless listed here: the examples' shipped models (warm starts)
# and SmolLM2's package folder are the shared folders of the tests' server, as /data/models is compose's.
_smollm2 = gguf_path()
os.environ.setdefault("AGENTFLY_ALLOWED_PATHS", ",".join(
    [str(Path(__file__).resolve().parents[2] / "examples"), *([str(_smollm2.parent)] if _smollm2 else [])]))

import django  # noqa: E402

django.setup()

from django.conf import settings as _settings  # noqa: E402

# The default PBKDF2 hasher costs ~0.3 s per user on this machine; the tests make two users per test.
# (PBKDF2 stays available for tests whose password is checked by a server process with default settings.)
_settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher",
                              "django.contrib.auth.hashers.PBKDF2PasswordHasher"]

from tests.webapp.helpers import PASSWORD, ROOT, Daphne, Worker, wait_for, worker_env  # noqa: E402, F401

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix: None) -> None:
    from django.conf import settings

    db = settings.DATABASES["default"]
    if db["ENGINE"].endswith("postgresql"):
        db.setdefault("TEST", {})["NAME"] = f"test_{db['NAME']}_webapp"
    elif db["ENGINE"].endswith("sqlite3"):
        # The demo's settings (``DATABASE_URL=sqlite:///...``): a test file beside the demo's, never in memory,
        # so the session's worker opens the same database (WAL, busy timeout: ``webapp/settings.py``).
        db.setdefault("TEST", {})["NAME"] = str(Path(db["NAME"]).with_name(f"test_{Path(db['NAME']).stem}.sqlite3"))


@pytest.fixture(scope="session")
def runs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Checkpoints and tiny models of the session's jobs (shared by the web side and the workers)."""
    from django.conf import settings

    path = tmp_path_factory.mktemp("webapp-runs")
    settings.AGENTFLY_RUNS_DIR = path
    return path


def _user(username: str, team_name: str, **extra: Any) -> Any:
    from django.contrib.auth import get_user_model

    from webapp.accounts.models import do_create_team

    user = get_user_model().objects.create_user(username=username, password=PASSWORD, **extra)
    do_create_team(team_name, user)
    return user


@pytest.fixture
def alice(db: None) -> Any:
    return _user("alice", "Team A")


@pytest.fixture
def bob(db: None) -> Any:
    return _user("bob", "Team B")


@pytest.fixture
def team_a(alice: Any) -> Any:
    from webapp.accounts.models import Team

    return Team.objects.of(alice).get()


@pytest.fixture
def team_b(bob: Any) -> Any:
    from webapp.accounts.models import Team

    return Team.objects.of(bob).get()


@pytest.fixture
def alice_for_the_server(alice: Any) -> Any:
    """alice with her password hashed the way the server's (default) settings can check it."""
    from django.contrib.auth.hashers import make_password

    alice.password = make_password(PASSWORD, hasher="pbkdf2_sha256")
    alice.save(update_fields=["password"])
    return alice


@pytest.fixture
def alice_client(alice: Any) -> Any:
    from django.test import Client

    client = Client()
    client.force_login(alice)
    return client


@pytest.fixture
def bob_client(bob: Any) -> Any:
    from django.test import Client

    client = Client()
    client.force_login(bob)
    return client


@pytest.fixture
def alice_api(alice: Any) -> Any:
    from rest_framework.authtoken.models import Token
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=alice).key}")
    return client


@pytest.fixture
def bob_api(bob: Any) -> Any:
    from rest_framework.authtoken.models import Token
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=bob).key}")
    return client


@pytest.fixture
def rate_limits(settings: Any) -> Any:
    """Set throttle rates for one test, ``rate_limits({"try": "2/minute"})``, starting from no counted requests.

    The counters live in the real Redis under this session's cache prefix, outside any test transaction.
    """
    import redis

    client = redis.Redis.from_url(settings.REDIS_URL)
    stale = list(client.scan_iter(f"{settings.CACHES['default']['KEY_PREFIX']}:*"))
    if stale:
        client.delete(*stale)

    def set_rates(rates: dict[str, str]) -> None:
        current = settings.REST_FRAMEWORK
        settings.REST_FRAMEWORK = {**current, "DEFAULT_THROTTLE_RATES": {**current["DEFAULT_THROTTLE_RATES"], **rates}}

    return set_rates


# ------------------------------------------------------------------------------------------ real workers
@pytest.fixture(scope="session")
def worker(django_db_setup: None, django_db_blocker: Any, runs_dir: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    """One worker on the ``cpu``, ``try`` and ``inspect`` queues for the whole session (training,
    introspection, "try it", MCP inspections)."""
    from webapp.celery import app

    app.control.purge()  # messages a previous, interrupted session left in the test broker
    with django_db_blocker.unblock():
        env = worker_env(runs_dir)
    w = Worker("cpu,try,inspect", env, tmp_path_factory.mktemp("worker") / "worker.log")
    try:
        w.wait_ready()
        yield w
    finally:
        w.stop()


@pytest.fixture
def builtins(transactional_db: None, worker: Worker) -> dict[str, Any]:
    """The built-in tools and rewards, registered by the worker (each transactional test starts empty)."""
    from webapp.registry.models import Entry
    from webapp.registry.tasks import sync_builtins

    sync_builtins.apply_async(queue="cpu").get(timeout=60)
    return {e.name: e for e in Entry.objects.filter(team__isnull=True)}


# ------------------------------------------------------------------------------------------ browser tests
@pytest.fixture
def daphne(transactional_db: None, runs_dir: Path, tmp_path: Path) -> Iterator[Daphne]:
    """Daphne serving ``webapp.asgi`` against this test's database, stopped after the test.

    It hears the channel layer this test process uses (a monitor test's private prefix, which its autouse
    fixture set before this one runs), so events stored here reach the pages it serves.
    """
    from django.conf import settings
    from django.db import connection

    connection.ensure_connection()
    prefix = settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"]
    server = Daphne({**worker_env(runs_dir), "CHANNEL_LAYER_PREFIX": prefix}, tmp_path / "daphne.log")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def browser_page() -> Iterator[Any]:
    """A headless Debian Chromium page (Playwright's sync API, never the browser ``playwright install`` would
    download); ``page.errors`` collects the page's uncaught JavaScript errors.

    Playwright's sync API runs its own event loop on the test's thread, where Django's ORM refuses to run:
    a test makes its rows before it first drives the page, or touches the database from another thread.
    (So one browser per test, not per session: a session-wide loop would block every later test's ORM.)
    """
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get update && apt-get install -y chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        context = browser.new_context(viewport={"width": 1440, "height": 1800})
        page = context.new_page()
        page.errors = []
        page.on("pageerror", lambda exc: page.errors.append(str(exc)))
        try:
            yield page
        finally:
            browser.close()


@pytest.fixture
def server_redis() -> Iterator[Any]:
    """The web app's own Redis connection; the teams' Redis users and API budgets a test made are removed after it
    (``webapp.jobs.apis``)."""
    import redis

    from webapp.jobs import apis

    r = redis.Redis.from_url(_settings.REDIS_URL)
    try:
        r.ping()
    except redis.ConnectionError:
        pytest.skip("needs Redis on 127.0.0.1:6379")
    yield r
    for slug in ("team-a", "team-b"):
        r.execute_command("ACL", "DELUSER", apis.redis_username(slug))
        for key in r.scan_iter(match=apis.key_pattern(slug)):
            r.delete(key)
    r.close()
