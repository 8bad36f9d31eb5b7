"""Django settings for the AgentFly web app, read from environment variables.

Every knob comes from the environment through the small typed helpers below, so one image runs as the demo
(SQLite, DEBUG), in CI (PostgreSQL, Redis on localhost) and in production (``DEBUG`` off: secure cookies,
HSTS, a required ``SECRET_KEY``). Nothing here imports the library or the trainer. The web process imports
only what checks a launch (``trainer.config``, and the names of the built-in resources); workers import the
rest inside tasks.
"""

from __future__ import annotations

import json
import os
import socket
from datetime import timedelta
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    lowered = raw.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean; use 1/0, true/false, yes/no or on/off")


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not an integer") from None


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a number") from None


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


DEBUG = env_bool("DEBUG", False)

_secret = os.environ.get("SECRET_KEY", "")
if not _secret:
    if not DEBUG:
        raise ImproperlyConfigured(
            "SECRET_KEY is not set; set it to a long random string, or set DEBUG=1 for local development"
        )
    _secret = "insecure-development-key-only-used-when-DEBUG-is-on"
SECRET_KEY = _secret

# Local addresses by default, DEBUG or not: a production host is named on purpose, never "*".
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "csp",
    "webapp.accounts",
    "webapp.registry",
    "webapp.mcpservers",
    "webapp.jobs",
    "webapp.monitor",
    "webapp.sweeps",
    "webapp.alerts",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "csp.middleware.CSPMiddleware",
]

ROOT_URLCONF = "webapp.urls"
WSGI_APPLICATION = None
ASGI_APPLICATION = "webapp.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "webapp.accounts.context_processors.teams",
            ],
        },
    },
]

DATABASES = {
    "default": dj_database_url.parse(
        env_str("DATABASE_URL", f"sqlite:///{BASE_DIR / 'runs' / 'webapp.sqlite3'}"),
        conn_max_age=env_int("DB_CONN_MAX_AGE", 0),
    )
}
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # The demo runs the web server and a worker against one SQLite file: wait for the write lock instead of
    # failing with "database is locked" while the worker writes a batch of events.
    DATABASES["default"].setdefault("OPTIONS", {}).update({
        "timeout": 30,
        # WAL lets the pages read while the worker writes (no "database is locked" for readers), and an
        # IMMEDIATE transaction takes the write lock when it begins, so a writer waits its busy timeout
        # instead of failing when it upgrades a read to a write.
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "transaction_mode": "IMMEDIATE",
    })
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "jobs:list"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(env_str("STATIC_ROOT", str(BASE_DIR / "staticfiles")))
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"
        if DEBUG
        else "whitenoise.storage.CompressedManifestStaticFilesStorage"
    },
}
# Serve straight from STATICFILES_DIRS when collectstatic has not run (the demo, the tests).
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

# ------------------------------------------------------------------ security when DEBUG is off
if not DEBUG:
    SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", True)
    CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", True)
    SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", True)
    SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 3600)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    # Preloading is a promise to browsers that is hard to take back: an operator opts in explicitly.
    SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", False)
    if not SECURE_HSTS_PRELOAD:
        SILENCED_SYSTEM_CHECKS = ["security.W021"]
    # X-Forwarded-Proto is a client's to forge unless a proxy we run sets it: trusted only behind
    # AGENTFLY_NUM_PROXIES proxies (see below), as X-Forwarded-For is.
    if env_int("AGENTFLY_NUM_PROXIES", 0) > 0:
        SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_CONTENT_TYPE_NOSNIFF = True
    X_FRAME_OPTIONS = "DENY"

# ------------------------------------------------------------------ Redis, Celery, Channels
REDIS_URL = env_str("REDIS_URL", "redis://127.0.0.1:6379/0")
# A namespace for every Redis key, queue, control channel and channel-layer group of this deployment, so
# several deployments (or concurrent test sessions) can share one Redis without taking each other's tasks.
REDIS_PREFIX = env_str("AGENTFLY_REDIS_PREFIX", "")

CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", REDIS_URL)
CELERY_RESULT_BACKEND = env_str("CELERY_RESULT_BACKEND", REDIS_URL)
# A job's time is its team's quota (AGENTFLY_QUOTA_MAX_SECONDS below): the worker stops it at a step with a
# checkpoint. These Celery limits are only the backstop for a task that stops answering, well above any quota.
JOB_TIME_LIMIT = env_int("JOB_TIME_LIMIT", 7 * 24 * 3600)
JOB_SOFT_TIME_LIMIT = env_int("JOB_SOFT_TIME_LIMIT", JOB_TIME_LIMIT - 300)
# With acks_late, Redis hands an unacknowledged message to another worker once the visibility timeout
# passes, even while the first worker still runs it: keep it longer than the longest job (the task's claim
# makes a redelivery a no-op anyway, but it would occupy a worker slot for nothing).
CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, object] = {"visibility_timeout": JOB_TIME_LIMIT + 3600}
if REDIS_PREFIX:
    CELERY_BROKER_TRANSPORT_OPTIONS["global_keyprefix"] = REDIS_PREFIX
    CELERY_RESULT_BACKEND_TRANSPORT_OPTIONS = {"global_keyprefix": REDIS_PREFIX}
# Broadcasts (revoke, ping) travel on these exchanges: prefixed too, or one deployment's revoke of
# "agentfly-job-5" would drop another deployment's job 5.
CELERY_CONTROL_EXCHANGE = f"{REDIS_PREFIX}celery"
CELERY_EVENT_EXCHANGE = f"{REDIS_PREFIX}celeryev"
# The worker stamps a running job every JOB_HEARTBEAT_SECONDS; a job whose stamp is older than
# JOB_HEARTBEAT_TIMEOUT is taken to have lost its worker and is marked failed.
JOB_HEARTBEAT_SECONDS = env_float("JOB_HEARTBEAT_SECONDS", 5.0)
JOB_HEARTBEAT_TIMEOUT = env_float("JOB_HEARTBEAT_TIMEOUT", 60.0)

# A consumer waits on Redis with a 5 s BZPOPMIN; redis-py 8 defaults socket_timeout to 5 s, so an idle socket
# would time out first and crash the consumer (close 1011) every 5 s. Read timeout well above the poll.
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {"hosts": [{"address": REDIS_URL, "socket_timeout": 30, "socket_connect_timeout": 5}],
                   "prefix": env_str("CHANNEL_LAYER_PREFIX", f"{REDIS_PREFIX}asgi"), "capacity": 1000, "expiry": 60},
    }
}

# Where jobs write checkpoints and built tiny models; shared by workers (a volume in docker-compose).
AGENTFLY_RUNS_DIR = Path(env_str("AGENTFLY_RUNS_DIR", str(BASE_DIR / "runs" / "webapp")))
# Folders whose Python modules teams may register as tools and rewards (added to sys.path on workers).
AGENTFLY_PLUGIN_DIRS = [Path(p) for p in env_list("AGENTFLY_PLUGIN_DIRS", [])]
# Inference servers (vLLM, OpenAI-compatible) each team may run its jobs on (engine=remote), as JSON: team slug
# -> base URLs, "*" for every team, e.g. {"*": ["http://gpu1:8000"], "nlp": ["http://gpu2:8000"]}. A job on
# them gets new weights after each update, so list only servers a team may change. Empty: none.
AGENTFLY_INFERENCE_SERVERS: dict[str, list[str]] = json.loads(env_str("AGENTFLY_INFERENCE_SERVERS", "{}") or "{}")
# Judge servers (vLLM, OpenAI-compatible) each team's judge rewards may call, as JSON: team slug (or "*" for
# every team) -> {base URL: the served model's folder on the workers (its tokenizer and config)}, e.g.
# {"*": {"http://gpu3:8000": "/data/models/judge-7b"}}. Separate from AGENTFLY_INFERENCE_SERVERS: a judge is
# never sent weights, so one server can serve every team, and its tokenizer must be known. Empty: none.
AGENTFLY_JUDGE_SERVERS: dict[str, dict[str, str]] = json.loads(env_str("AGENTFLY_JUDGE_SERVERS", "") or "{}")
if not isinstance(AGENTFLY_JUDGE_SERVERS, dict) or not all(
        isinstance(servers, dict) and all(isinstance(u, str) and isinstance(m, str) for u, m in servers.items())
        for servers in AGENTFLY_JUDGE_SERVERS.values()):
    raise ImproperlyConfigured('AGENTFLY_JUDGE_SERVERS: give {"team slug or *": {"http://host:port": '
                               '"/model/folder"}}, e.g. {"*": {"http://gpu3:8000": "/data/models/judge"}}')
# The shared folders (models, datasets) every team's jobs may read; besides these a job may use only its own
# team's folder (webapp.jobs.paths.check_config). Empty: nothing outside the team's folder.
AGENTFLY_ALLOWED_PATHS = [Path(p) for p in env_list("AGENTFLY_ALLOWED_PATHS", [])]
# Time the web process waits for a worker to answer a "try it" call before telling the user.
AGENTFLY_TRY_TIMEOUT = env_float("AGENTFLY_TRY_TIMEOUT", 30.0)
# The Ray cluster that runs jobs' environments ("" = each job's own host); budgets per team slug as JSON,
# "*" for every other team: {"*": {"sandbox": 64}, "vision": {"sandbox": 16}} (webapp/jobs/cluster.py).
AGENTFLY_RAY_ADDRESS = env_str("AGENTFLY_RAY_ADDRESS", "")
AGENTFLY_RAY_TEAM_BUDGETS: dict[str, dict[str, int]] = json.loads(env_str("AGENTFLY_RAY_TEAM_BUDGETS", "") or "{}")
if not isinstance(AGENTFLY_RAY_TEAM_BUDGETS, dict) or not all(
        isinstance(b, dict) and all(isinstance(n, int) and n >= 0 for n in b.values())
        for b in AGENTFLY_RAY_TEAM_BUDGETS.values()):
    raise ImproperlyConfigured('AGENTFLY_RAY_TEAM_BUDGETS: give {"team slug or *": {"resource": whole number}}, '
                               'e.g. {"*": {"sandbox": 64}, "vision": {"sandbox": 16}}')
# The custom Ray resources an instance asks for, by resource name or kind: environments of every kind (sandboxes,
# simulators, MCP sessions, stores) go to the nodes started with --resources='{"sandbox": N}', N at a time, never
# to the head; model services and API clients ask for none.
RAY_ENVIRONMENT_KINDS = ("sandbox", "environment", "mcp", "other")
AGENTFLY_RAY_PLACEMENT: dict[str, dict[str, float]] = json.loads(
    env_str("AGENTFLY_RAY_PLACEMENT", "") or json.dumps({kind: {"sandbox": 1} for kind in RAY_ENVIRONMENT_KINDS}))
# Registrable code (docs/security.md): besides AgentFly's built-ins and AGENTFLY_PLUGIN_DIRS, the installed
# packages whose @agentfly.tool / @agentfly.reward objects teams may register (comma list of package names).
AGENTFLY_TOOL_PACKAGES = env_list("AGENTFLY_TOOL_PACKAGES", [])
# Seconds a worker's child process may spend on one inspection or "try it" call before it is killed (keep
# it below AGENTFLY_TRY_TIMEOUT, so the user hears why), and "try it" calls one user may have in flight.
AGENTFLY_CHILD_TIMEOUT = env_float("AGENTFLY_CHILD_TIMEOUT", 20.0)
AGENTFLY_TRY_CONCURRENCY = env_int("AGENTFLY_TRY_CONCURRENCY", 2)
# The "try it" pool (webapp.registry.trying): calls at once on the whole server (give the try workers at least
# this concurrency: `celery -A webapp worker -Q try -c 4`), and per team. Keep the pool above one team's share,
# so one team's looping calls leave room for the others.
AGENTFLY_TRY_POOL = env_int("AGENTFLY_TRY_POOL", 4)
AGENTFLY_TRY_TEAM_CONCURRENCY = env_int("AGENTFLY_TRY_TEAM_CONCURRENCY", 2)

# ------------------------------------------------------------------ jobs run as their team (docs/security.md)
# How the training process is isolated: "bwrap" (a bubblewrap sandbox: no secret, only its team's folders)
# or "off" (the worker's own view less the secret variables; only for a server with one trusted team).
AGENTFLY_JOB_SANDBOX = env_str("AGENTFLY_JOB_SANDBOX", "bwrap")
# The training process's network: "auto" (its own loopback only, the host's network for a multi-node job),
# "none" (always loopback only) or "host" (always the host's: remote engines, a Ray cluster, hub downloads).
AGENTFLY_JOB_NETWORK = env_str("AGENTFLY_JOB_NETWORK", "auto")
# Environment variables of the worker passed on to the training process by name (never a secret).
AGENTFLY_JOB_ENV = env_list("AGENTFLY_JOB_ENV", [
    "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE", "TOKENIZERS_PARALLELISM", "MKL_NUM_THREADS", "TZ", "AGENTFLY_SANDBOX_DIR"])

# Per-team quotas (docs/security.md): defaults for every team; the admin's "team quotas" override them per
# team. A launch past one is refused with the quota's name.
AGENTFLY_QUOTA_CONCURRENT_JOBS = env_int("AGENTFLY_QUOTA_CONCURRENT_JOBS", 4)  # queued, running or preempted
AGENTFLY_QUOTA_MAX_STEPS = env_int("AGENTFLY_QUOTA_MAX_STEPS", 100_000)  # a job's total steps
AGENTFLY_QUOTA_MAX_SECONDS = env_int("AGENTFLY_QUOTA_MAX_SECONDS", 24 * 3600)  # a job's running time, all runs
# Quotas that follow the person: a member's jobs queued, running or preempted at once over all of their teams
# (so a new team of their own adds no room), and the teams one account may create (sign-up's team counts).
AGENTFLY_QUOTA_USER_CONCURRENT_JOBS = env_int("AGENTFLY_QUOTA_USER_CONCURRENT_JOBS", 4)
# The memory a team's Redis user may fill with its API budgets' keys (a budget takes a few hundred bytes);
# beat cuts off a team past it every 5 s (webapp/jobs/apis.py).
AGENTFLY_TEAM_REDIS_MAX_BYTES = env_int("AGENTFLY_TEAM_REDIS_MAX_BYTES", 1 << 20)
AGENTFLY_TEAMS_PER_USER = env_int("AGENTFLY_TEAMS_PER_USER", 5)
# The most runs one sweep launches (each is a job, counted against the team's concurrent-jobs quota).
AGENTFLY_SWEEP_MAX_RUNS = env_int("AGENTFLY_SWEEP_MAX_RUNS", 32)
# Alerts (webapp.alerts): webhook hosts allowed to resolve to loopback or private addresses (none by default),
# the first retry's delay (doubling each time), the address jobs' links start with, and mail (off without a host).
AGENTFLY_ALERT_ALLOWED_HOSTS = env_list("AGENTFLY_ALERT_ALLOWED_HOSTS", [])
AGENTFLY_ALERT_RETRY_S = env_int("AGENTFLY_ALERT_RETRY_S", 30)
AGENTFLY_SITE_URL = env_str("AGENTFLY_SITE_URL", "")
EMAIL_HOST = env_str("EMAIL_HOST", "")
EMAIL_PORT = env_int("EMAIL_PORT", 25)
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "agentfly@localhost")
# Fair share: a running job that has trained this long (from its run's first step) yields at its next step (with a checkpoint) when another
# team's job waits for a worker on its queue, and is queued again to resume from there. 0 never preempts.
AGENTFLY_TIME_SLICE = env_float("AGENTFLY_TIME_SLICE", 1800.0)
# Seconds a job has to stop by itself (at its next step, with a checkpoint) after a cancel or the end of its time
# slice; then its processes get SIGTERM, and SIGKILL 10 s later (webapp/jobs/isolation.py run_process).
AGENTFLY_JOB_STOP_GRACE = env_float("AGENTFLY_JOB_STOP_GRACE", 60.0)
# Each job runs in a cgroup of its own with these limits (rlimits with the same numbers where the host gives no
# cgroup): a JSON object from team slug, or "*" for every team, to {"memory_bytes", "cpus", "processes"}.
AGENTFLY_JOB_LIMITS = json.loads(env_str("AGENTFLY_JOB_LIMITS", json.dumps(
    {"*": {"memory_bytes": 16 << 30, "cpus": None, "processes": 512}})))

# MCP servers teams may register (webapp/mcpservers/rules.py): exact stdio argv the operator allows (a JSON
# list of lists), HTTP URL prefixes, hosts allowed to resolve to loopback/link-local, and the stdio servers
# ("team-slug/server-name") that may use the network.
AGENTFLY_MCP_COMMANDS = json.loads(env_str("AGENTFLY_MCP_COMMANDS", "[]"))
AGENTFLY_MCP_URLS = env_list("AGENTFLY_MCP_URLS", [])
AGENTFLY_MCP_LOCAL_HOSTS = env_list("AGENTFLY_MCP_LOCAL_HOSTS", [])
AGENTFLY_MCP_NETWORK = env_list("AGENTFLY_MCP_NETWORK", [])
# A server's inspection (start it, list its tools) runs on the `inspect` queue, never on `cpu` beside training
# jobs: at most AGENTFLY_MCP_INSPECT_POOL at once over the server (run its worker with that many processes:
# `celery -A webapp worker -Q inspect -c 2`), AGENTFLY_MCP_INSPECT_TEAM_CONCURRENCY per team (a registration
# beyond it is refused until one ends), each stopped after AGENTFLY_MCP_INSPECT_TIMEOUT seconds.
AGENTFLY_MCP_INSPECT_POOL = env_int("AGENTFLY_MCP_INSPECT_POOL", 2)
AGENTFLY_MCP_INSPECT_TEAM_CONCURRENCY = env_int("AGENTFLY_MCP_INSPECT_TEAM_CONCURRENCY", 1)
AGENTFLY_MCP_INSPECT_TIMEOUT = env_float("AGENTFLY_MCP_INSPECT_TIMEOUT", 60.0)
# Paths every stdio server may read (read-only) besides the Python installation and its team's plugin folder
# (a shared repository for an allowlisted mcp-server-git): a server's argv never makes a path readable.
AGENTFLY_MCP_READ_PATHS = env_list("AGENTFLY_MCP_READ_PATHS", [])

# ------------------------------------------------------------------ REST API
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_PAGINATION_CLASS": "webapp.inputs.BoundedLimitOffsetPagination",
    "DEFAULT_PARSER_CLASSES": ["webapp.inputs.SafeJSONParser", "webapp.inputs.SafeFormParser",
                               "webapp.inputs.SafeMultiPartParser"],
    "EXCEPTION_HANDLER": "webapp.inputs.exception_handler",
    "PAGE_SIZE": 50,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "AgentFly API",
    "DESCRIPTION": "Register tools and rewards, launch, cancel and resume training jobs, read their events.",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # Swagger UI's assets come from the sidecar package through WhiteNoise, never from a CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Two models have a field named `kind` (a job's rl/sft/sft_then_rl, a registry entry's tool/reward): each
    # enum gets its own name in the schema.
    "ENUM_NAME_OVERRIDES": {"JobKindEnum": "webapp.jobs.models.Kind", "EntryKindEnum": "webapp.registry.models.Kind",
                            # two invitations, each with its own `state`
                            "InvitationStateEnum": ["pending", "used", "revoked", "expired"],
                            "TeamInvitationStateEnum": ["pending", "accepted", "declined"],
                            "MCPServerStatusEnum": "webapp.mcpservers.models.Status",
                            "SweepKindEnum": "webapp.sweeps.models.Kind"},
    # Every operation also documents the errors it can answer (400, 401, 403, 404, ...), so a client, and
    # the schemathesis run in the tests, can rely on the schema for every status code.
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums",
                             "webapp.schema.document_error_responses"],
}

# ------------------------------------------------------------------ input limits and headers
# Any request body over this many bytes is refused with 413 before it is read or buffered (webapp.bodylimit,
# and webapp.serve under Daphne); keep it above DATA_UPLOAD_MAX_MEMORY_SIZE.
AGENTFLY_MAX_BODY_BYTES = env_int("AGENTFLY_MAX_BODY_BYTES", 10 * 1024 * 1024)
# Request bodies over this many bytes are refused (Django's setting; the API's JSON parser applies it too).
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("DATA_UPLOAD_MAX_MEMORY_SIZE", 2_621_440)
# JSON (API bodies, the launch form's resources, "try it" arguments) nested deeper than this is a 400.
AGENTFLY_MAX_JSON_DEPTH = env_int("AGENTFLY_MAX_JSON_DEPTH", 64)
# Refuse a launch on the gpu queue while no Celery worker consumes it (asked of the workers, cached briefly).
AGENTFLY_CHECK_GPU_WORKERS = env_bool("AGENTFLY_CHECK_GPU_WORKERS", True)
AGENTFLY_WORKER_CHECK_CACHE_SECONDS = env_float("AGENTFLY_WORKER_CHECK_CACHE_SECONDS", 30.0)
# A multi-node job's first node hosts the ranks' rendezvous (torchrun's TCP store) at this worker's address,
# which the other nodes' workers must reach: set it on each GPU host (its name or IP on the cluster network).
AGENTFLY_NODE_ADDRESS = env_str("AGENTFLY_NODE_ADDRESS", socket.getfqdn())
# Content-Security-Policy (django-csp): scripts only from this origin, never inline or eval'd. Styles allow
# 'unsafe-inline' because Plotly writes style attributes and <style> elements at run time; a style cannot run
# code. Websockets (the dashboard's live stream) connect to this host.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'", "'unsafe-inline'"],
        "img-src": ["'self'", "data:", "blob:"],
        "font-src": ["'self'", "data:"],
        "connect-src": ["'self'", "ws:", "wss:"],
        "worker-src": ["'self'", "blob:"],
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    },
}
if not DEBUG:
    # An operator who turns one of these off on purpose (docker-compose over plain HTTP on localhost, or TLS
    # ended at a proxy) has answered the deployment check's question: silence that check only then.
    _opted_out = {"SECURE_SSL_REDIRECT": "security.W008", "SESSION_COOKIE_SECURE": "security.W012",
                  "CSRF_COOKIE_SECURE": "security.W016"}
    SILENCED_SYSTEM_CHECKS = [*globals().get("SILENCED_SYSTEM_CHECKS", []),
                              *(check for name, check in _opted_out.items() if not env_bool(name, True))]

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
}

# ------------------------------------------------------------------ accounts and rate limits (docs/security.md)
# Who may create an account: "open" (anyone, the demo), "invite" (only with a team's invitation link, the
# default when DEBUG is off) or "closed" (only an administrator: manage.py createsuperuser or the admin).
SIGNUP_MODES = ("open", "invite", "closed")
AGENTFLY_SIGNUP = env_str("AGENTFLY_SIGNUP", "") or ("open" if DEBUG else "invite")
if AGENTFLY_SIGNUP not in SIGNUP_MODES:
    raise ImproperlyConfigured(f"AGENTFLY_SIGNUP={AGENTFLY_SIGNUP!r} is not one of {', '.join(SIGNUP_MODES)}")
# How long an invitation link stays valid.
AGENTFLY_INVITE_DAYS = env_float("AGENTFLY_INVITE_DAYS", 7.0)

# Throttle counters live in Redis, so every web process counts the same requests (login failures: the database).
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": f"{REDIS_PREFIX}cache",
    }
}

# Login lockout (django-axes): after AGENTFLY_LOGIN_FAILURE_LIMIT wrong passwords for one username from one
# address, that pair is refused for AGENTFLY_LOGIN_COOLOFF_MINUTES, on /login/, /admin/ and /api/token/.
# Locking by the pair (not the username alone) keeps a stranger from locking a colleague out at will.
INSTALLED_APPS.append("axes")
MIDDLEWARE.append("axes.middleware.AxesMiddleware")  # axes wants to be last: it rewrites the response
AUTHENTICATION_BACKENDS = ["axes.backends.AxesStandaloneBackend", "django.contrib.auth.backends.ModelBackend"]
AXES_FAILURE_LIMIT = env_int("AGENTFLY_LOGIN_FAILURE_LIMIT", 5)
AXES_COOLOFF_TIME = timedelta(minutes=env_float("AGENTFLY_LOGIN_COOLOFF_MINUTES", 15.0))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_CALLABLE = "webapp.accounts.views.locked_out"  # a page that says when to try again
AXES_CLIENT_IP_CALLABLE = "webapp.accounts.throttling.client_ip"
AXES_ENABLE_ADMIN = False  # webapp/accounts/admin.py registers the attempts for superusers only

# Request rates (DRF throttles, also applied to the matching HTML views). Each is "N/second|minute|hour|day".
# Proxies in front of the web process that append to X-Forwarded-For; 0 trusts only the socket's address
# (otherwise a client picks its own address, and its own throttle bucket, with one header).
AGENTFLY_NUM_PROXIES = env_int("AGENTFLY_NUM_PROXIES", 0)


def env_rate(name: str, default: str) -> str:
    raw = env_str(name, default).strip()
    count, _, period = raw.partition("/")
    if not (count.isdigit() and period[:1] in {"s", "m", "h", "d"}):
        raise ImproperlyConfigured(f"{name}={raw!r} is not a rate; write it as N/second, N/minute, N/hour or N/day")
    return raw


AGENTFLY_RATES = {
    "anon": env_rate("AGENTFLY_RATE_ANON", "120/hour"),
    "user": env_rate("AGENTFLY_RATE_USER", "3600/hour"),
    "token": env_rate("AGENTFLY_RATE_TOKEN", "20/hour"),
    "signup": env_rate("AGENTFLY_RATE_SIGNUP", "10/hour"),
    "try": env_rate("AGENTFLY_RATE_TRY", "30/minute"),
    "launch": env_rate("AGENTFLY_RATE_LAUNCH", "30/hour"),
    "team": env_rate("AGENTFLY_RATE_TEAM", "5/day"),
}
REST_FRAMEWORK.update({
    "DEFAULT_THROTTLE_CLASSES": [
        "webapp.accounts.throttling.AnonThrottle",
        "webapp.accounts.throttling.UserThrottle",
        "webapp.accounts.throttling.ScopedThrottle",
    ],
    "DEFAULT_THROTTLE_RATES": AGENTFLY_RATES,
    "NUM_PROXIES": AGENTFLY_NUM_PROXIES,
})
