"""Settings from the environment, the compose file under a real compose parser, and the one-machine demo."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def settings_in_subprocess(env: dict[str, str], expr: str) -> subprocess.CompletedProcess[str]:
    """Import ``webapp.settings`` fresh under ``env`` and print ``expr`` as JSON."""
    clean = {k: v for k, v in os.environ.items() if k not in {"DEBUG", "SECRET_KEY", "ALLOWED_HOSTS", "DATABASE_URL"}}
    code = f"import json, webapp.settings as s; print(json.dumps({expr}, default=str))"
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**clean, **env}, capture_output=True,
                          text=True, timeout=60)


def test_production_settings_refuse_to_start_without_a_secret_key() -> None:
    result = settings_in_subprocess({"DEBUG": "0"}, "s.SECRET_KEY")
    assert result.returncode != 0
    assert "SECRET_KEY is not set" in result.stderr


def test_production_settings_are_secure_by_default() -> None:
    result = settings_in_subprocess(
        {"DEBUG": "0", "SECRET_KEY": "k" * 50, "ALLOWED_HOSTS": "agentfly.example, www.agentfly.example",
         "DATABASE_URL": "postgres://u:p@db:5432/agentfly"},
        "[s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE, s.SECURE_SSL_REDIRECT, s.SECURE_HSTS_SECONDS > 0, "
        "s.ALLOWED_HOSTS, s.DATABASES['default']['ENGINE'], s.DATABASES['default']['HOST']]")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [True, True, True, True, ["agentfly.example", "www.agentfly.example"],
                                         "django.db.backends.postgresql", "db"]


def test_djangos_deployment_checks_pass_with_production_settings() -> None:
    clean = {k: v for k, v in os.environ.items() if k not in {"DEBUG", "DATABASE_URL"}}
    env = {**clean, "DEBUG": "0", "SECRET_KEY": "a-long-random-secret-" * 4, "ALLOWED_HOSTS": "agentfly.example"}
    result = subprocess.run([sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"], cwd=ROOT,
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_the_demo_default_is_sqlite_and_bad_values_name_the_variable() -> None:
    ok = settings_in_subprocess({"DEBUG": "1"}, "s.DATABASES['default']['ENGINE']")
    assert json.loads(ok.stdout) == "django.db.backends.sqlite3"
    bad = settings_in_subprocess({"DEBUG": "maybe"}, "s.DEBUG")
    assert bad.returncode != 0 and "DEBUG='maybe' is not a boolean" in bad.stderr
    bad = settings_in_subprocess({"DEBUG": "1", "JOB_HEARTBEAT_TIMEOUT": "soon"}, "s.JOB_HEARTBEAT_TIMEOUT")
    assert bad.returncode != 0 and "JOB_HEARTBEAT_TIMEOUT='soon' is not a number" in bad.stderr


def test_the_demos_sqlite_runs_in_wal_mode_and_waits_for_the_write_lock(tmp_path: Path) -> None:
    # Pages read while the worker writes, and a writer waits its busy timeout instead of "database is locked".
    code = ("import django, json; django.setup(); from django.db import connection; c = connection.cursor(); "
            "print(json.dumps([c.execute(f'PRAGMA {p}').fetchone()[0] for p in ('journal_mode', 'busy_timeout')]"
            " + [connection.transaction_mode]))")
    clean = {k: v for k, v in os.environ.items() if k not in {"DEBUG", "SECRET_KEY", "DATABASE_URL"}}
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                            env={**clean, "DEBUG": "1", "DJANGO_SETTINGS_MODULE": "webapp.settings",
                                 "DATABASE_URL": f"sqlite:///{tmp_path / 'demo.sqlite3'}"})
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == ["wal", 30000, "IMMEDIATE"]


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="needs Debian's docker-compose package")
def test_the_compose_file_is_valid_for_a_real_compose_parser() -> None:
    env = {**os.environ, "SECRET_KEY": "k" * 50, "REDIS_PASSWORD": "p" * 32, "RAY_AUTH_TOKEN": "t" * 64,
           "POSTGRES_PASSWORD": "d" * 48}
    result = subprocess.run(["docker-compose", "-f", "docker-compose.yml", "config"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    import yaml

    config = yaml.safe_load(result.stdout)
    services = config["services"]
    assert set(services) == {"web", "worker-cpu", "worker-try", "worker-inspect", "worker-gpu", "redis", "postgres",
                             "ray-head", "ray-worker"}
    # MCP inspections have a worker of their own: a server that never starts never holds worker-cpu.
    assert "-Q inspect " in services["worker-inspect"]["command"]
    # Jobs' environments go to the Ray worker node, the one with sandbox room, from the project's image.
    assert services["worker-cpu"]["environment"]["AGENTFLY_RAY_ADDRESS"] == "ray://ray-head:10001"
    assert '--resources={"sandbox": 16}' in services["ray-worker"]["command"]
    assert services["ray-head"]["image"] == services["ray-worker"]["image"] == services["web"]["image"]
    # One token for the cluster: its nodes and the workers (and through them, the jobs) that join it.
    for name in ("ray-head", "ray-worker", "worker-cpu"):
        assert services[name]["environment"]["RAY_AUTH_MODE"] == "token", name
        assert services[name]["environment"]["RAY_AUTH_TOKEN"] == "t" * 64, name
    assert all("healthcheck" in services[name] for name in services)
    devices = services["worker-gpu"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"] and devices[0]["driver"] == "nvidia"
    assert "-Q gpu" in " ".join(services["worker-gpu"]["command"] if isinstance(services["worker-gpu"]["command"], list)
                                else [services["worker-gpu"]["command"]])
    assert any("/data/runs" in str(v) for v in services["worker-cpu"]["volumes"])
    missing = subprocess.run(["docker-compose", "-f", "docker-compose.yml", "config", "-q"], cwd=ROOT,
                             env={k: v for k, v in os.environ.items() if k != "SECRET_KEY"},
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode != 0 and "set SECRET_KEY" in missing.stderr


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="needs Debian's docker-compose package")
def test_the_database_needs_the_password_from_the_environment_and_no_password_is_written_in_the_files() -> None:
    env = {**os.environ, "SECRET_KEY": "k" * 50, "REDIS_PASSWORD": "p" * 32, "RAY_AUTH_TOKEN": "t" * 64,
           "POSTGRES_PASSWORD": "d" * 48}
    result = subprocess.run(["docker-compose", "-f", "docker-compose.yml", "config"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    import yaml

    services = yaml.safe_load(result.stdout)["services"]
    postgres = services["postgres"]["environment"]
    assert postgres["POSTGRES_PASSWORD"] == "d" * 48
    assert postgres["POSTGRES_HOST_AUTH_METHOD"] == "scram-sha-256"
    assert "--auth-local=scram-sha-256" in postgres["POSTGRES_INITDB_ARGS"]
    assert "--auth-host=scram-sha-256" in postgres["POSTGRES_INITDB_ARGS"]
    for name in ("web", "worker-cpu", "worker-try", "worker-inspect", "worker-gpu"):
        assert services[name]["environment"]["DATABASE_URL"] == f"postgres://agentfly:{'d' * 48}@postgres:5432/agentfly"
    # The Debian-built image trusts nothing either.
    entrypoint = (ROOT / "deploy" / "postgres-entrypoint.sh").read_text()
    assert "trust" not in entrypoint.replace("trusted", "") and "--auth-local=scram-sha-256" in entrypoint
    # No password is written down: every one comes from the environment, and compose refuses to start without.
    compose = (ROOT / "docker-compose.yml").read_text()
    assert "agentfly:agentfly@" not in compose and "POSTGRES_PASSWORD: agentfly" not in compose
    without = subprocess.run(["docker-compose", "-f", "docker-compose.yml", "config", "-q"], cwd=ROOT,
                             env={k: v for k, v in env.items() if k != "POSTGRES_PASSWORD"},
                             capture_output=True, text=True, timeout=60)
    assert without.returncode != 0 and "set POSTGRES_PASSWORD" in without.stderr


@pytest.mark.slow
def test_the_demo_starts_everything_and_its_job_succeeds(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "AGENTFLY_RUNS_DIR", "DJANGO_SETTINGS_MODULE"}}
    env["REDIS_URL"] = "redis://127.0.0.1:1/0"  # nothing answers there: the demo must start its own Redis
    result = subprocess.run([sys.executable, "-m", "webapp.demo", "--port", "0", "--steps", "2", "--dir",
                             str(tmp_path), "--exit-when-done"], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "started redis-server" in result.stdout
    assert "watch job    http://127.0.0.1:" in result.stdout and "/jobs/1/" in result.stdout
    assert "job #1 succeeded at step 2" in result.stdout
    assert (tmp_path / "webapp.sqlite3").is_file()


def test_celery_takes_one_job_at_a_time_acknowledges_late_and_limits_training_time() -> None:
    from django.conf import settings

    from webapp.celery import app
    from webapp.jobs.tasks import run_job

    assert {q.name for q in app.conf.task_queues} == {"cpu", "gpu", "try", "inspect", "alerts"}
    assert app.conf.task_acks_late and app.conf.task_reject_on_worker_lost
    assert app.conf.worker_prefetch_multiplier == 1
    assert app.conf.broker_transport_options["visibility_timeout"] > settings.JOB_TIME_LIMIT
    assert run_job.time_limit == settings.JOB_TIME_LIMIT and run_job.soft_time_limit < run_job.time_limit
    assert "fail-stale-jobs" in app.conf.beat_schedule
