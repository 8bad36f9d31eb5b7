"""Start the whole web path on one machine and launch a tiny CPU training job you can watch.

    python -m webapp.demo                # web server on :8000, a worker, Redis, SQLite; Ctrl-C stops all
    python -m webapp.demo --port 8080 --steps 40
    python -m webapp.demo --model runs/calculator/sft   # start from the SFT warm start (agentfly sft ...)
    python -m webapp.demo --exit-when-done   # for CI: exit 0 once the job succeeded, 1 if it did not

What it does: uses Redis at ``REDIS_URL`` if one answers, otherwise starts ``redis-server`` on a free port
(no persistence); applies migrations to a SQLite file under ``runs/demo/`` (or ``DATABASE_URL``); creates
the user ``demo`` in team "Demo team"; starts ``daphne`` and a Celery worker (with the beat schedule that
sweeps for dead workers); waits until the worker has registered the built-in tools; launches a job
through the same form the browser uses; and prints the URL where it can be watched.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEMO_USER = "demo"
DEMO_PASSWORD = "agentfly-demo"
DEMO_TEAM = "Demo team"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def redis_answers(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except Exception:
        return False


class Services:
    """The subprocesses the demo started, stopped in reverse order on exit."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        log = (self.logs / f"{name}.log").open("wb")
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.procs.append((name, proc))
        return proc

    def check(self) -> None:
        for name, proc in self.procs:
            if proc.poll() is not None:
                tail = (self.logs / f"{name}.log").read_text(errors="replace")[-3000:]
                raise SystemExit(f"{name} exited with code {proc.returncode}; its log ends with:\n{tail}")

    def stop(self) -> None:
        for _, proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for _, proc in reversed(self.procs):
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def wait(what: str, predicate: Any, services: Services, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        services.check()
        if predicate():
            return
        time.sleep(0.5)
    raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}; see the logs in {services.logs}")


def http_ok(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status < 500)
    except Exception:
        return False


def configure_environment(args: argparse.Namespace, services: Services) -> dict[str, str]:
    demo_dir = Path(args.dir).resolve()
    demo_dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("DEBUG", "1")
    os.environ.setdefault("AGENTFLY_SIGNUP", "open")  # anyone who reaches the demo may make an account
    os.environ.setdefault("DATABASE_URL", f"sqlite:///{demo_dir / 'webapp.sqlite3'}")
    os.environ.setdefault("AGENTFLY_RUNS_DIR", str(demo_dir / "runs"))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    if not redis_answers(url):
        binary = shutil.which("redis-server")
        if binary is None:
            raise SystemExit(f"no Redis answers at {url} and redis-server is not installed; install Redis "
                             "(apt-get install redis-server) or set REDIS_URL to a running one")
        port = free_port()
        services.start("redis", [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                 "--appendonly", "no"], dict(os.environ))
        url = f"redis://127.0.0.1:{port}/0"
        wait("the embedded redis-server", lambda: redis_answers(url), services, 20)
        print(f"started redis-server on port {port} (no Redis answered at {os.environ.get('REDIS_URL', url)})")
    os.environ["REDIS_URL"] = url
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def demo_user() -> Any:
    from django.contrib.auth import get_user_model

    from webapp.accounts.models import Team, do_create_team

    user, created = get_user_model().objects.get_or_create(username=DEMO_USER)
    if created:
        user.set_password(DEMO_PASSWORD)
        user.save()
    team = Team.objects.filter(group__name=DEMO_TEAM).first() or do_create_team(DEMO_TEAM, user)
    team.add_member(user)
    return user, team


def launch_demo_job(user: Any, team: Any, steps: int, model: str | None = None) -> Any:
    """Launch through ``LaunchForm``, the same validation the launch page applies."""
    from webapp.jobs import actions
    from webapp.jobs.forms import LaunchForm
    from webapp.registry.models import Entry

    visible = Entry.objects.visible_to(user).ready()
    calculator = visible.get(team__isnull=True, kind="tool", name="calculator")
    math_equal = visible.get(team__isnull=True, kind="reward", name="math_equal")
    form = LaunchForm({
        "name": "demo: tiny agent with a calculator", "team": team.pk, "model_source": "path" if model else "tiny",
        "model_path": str(Path(model).resolve()) if model else "", "task": "arithmetic",
        "task_size": 200, "tools": [calculator.pk], "reward": math_equal.pk, "algorithm": "grpo", "steps": steps,
        "prompts_per_step": 2, "group_size": 4, "max_turns": 2, "max_new_tokens": 24, "learning_rate": 3e-4,
        "temperature": 1.0, "seed": 0, "eval_size": 8, "save_every": 5, "queue": "cpu",
    }, user=user)
    if not form.is_valid():
        raise SystemExit(f"the demo job's configuration is invalid: {form.errors.as_text()}")
    d = form.cleaned_data
    job, _ = actions.do_launch_job(user=user, team=team, name=d["name"], config=form.trainer_config(), queue="cpu",
                                   tool_versions=[calculator.current_version],
                                   reward_version=math_equal.current_version)
    return job


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Run the AgentFly web app, a worker and a tiny training job.")
    ap.add_argument("--port", type=int, default=8000, help="web server port (default 8000; 0 picks a free one)")
    ap.add_argument("--host", default="127.0.0.1", help="web server address (default 127.0.0.1)")
    ap.add_argument("--steps", type=int, default=30, help="training steps of the demo job (default 30)")
    ap.add_argument("--model", default=None,
                    help="a saved model directory to train (e.g. runs/calculator/sft from `agentfly sft`); "
                         "default: a tiny untrained model built on the worker")
    ap.add_argument("--dir", default=str(ROOT / "runs" / "demo"), help="SQLite file, checkpoints and logs")
    ap.add_argument("--exit-when-done", action="store_true", help="stop once the job finishes (exit 0 if it succeeded)")
    args = ap.parse_args(argv)
    if args.port == 0:
        args.port = free_port()

    logs = Path(args.dir).resolve() / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    services = Services(logs)
    try:
        env = configure_environment(args, services)
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", interactive=False, verbosity=0)
        user, team = demo_user()
        from django.conf import settings

        services.start("worker", [sys.executable, "-m", "celery", "-A", "webapp", "worker", "-Q", "cpu,gpu,try", "-c", "1",
                                  "-B", "-s", str(logs / "celerybeat-schedule"), "-l", "info", "-n", "demo@%h"], env)
        services.start("web", [sys.executable, "-m", "daphne", "-b", args.host, "-p", str(args.port),
                               "webapp.asgi:application"], env)
        base = f"http://{args.host}:{args.port}"
        wait("the web server", lambda: http_ok(f"{base}/login/"), services, 60)
        from webapp.registry.models import Entry

        wait("the worker to register the built-in tools",
             lambda: Entry.objects.filter(team__isnull=True, name__in=["calculator", "math_equal"]).ready().count() == 2,
             services, 120)
        job = launch_demo_job(user, team, args.steps, args.model)
        print(f"\nAgentFly is running ({settings.DATABASES['default']['NAME']}, Redis {settings.REDIS_URL}).")
        print(f"  sign in at   {base}/login/   as {DEMO_USER} / {DEMO_PASSWORD}")
        print(f"  watch job    {base}{job.get_absolute_url()}")
        print(f"  dashboard    {base}/monitor/jobs/{job.pk}/")
        print(f"  logs         {logs}\nPress Ctrl-C to stop.\n", flush=True)
        while True:
            services.check()
            job.refresh_from_db()
            if args.exit_when_done and job.is_finished:
                print(f"job #{job.pk} {job.status} at step {job.step}: {job.final_metrics.get('reward/mean', '')}")
                return 0 if job.status == "succeeded" else 1
            time.sleep(1)
    except KeyboardInterrupt:
        return 0
    finally:
        services.stop()


if __name__ == "__main__":
    sys.exit(main())
