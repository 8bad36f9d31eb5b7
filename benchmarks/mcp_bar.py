"""Issue 30's learning bar through the web app: the key chain with its store served by a team's registered MCP
server, trained by jobs launched through the REST API, evaluated on held-out problems.

    python benchmarks/mcp_bar.py                                    # 3 seeds x 15 minutes (about an hour on 2 cores)
    python benchmarks/mcp_bar.py --seeds 0 --minutes 1 --eval-n 50  # a smoke run (a few minutes)

What it does, as a team would (``examples/key_chain/bar.sh`` is the same bar from the command line):

1. starts the stack as ``python -m webapp.demo`` does, with its functions: Redis (under a key prefix of its
   own, so its queues never take another deployment's jobs), SQLite under ``--dir`` (or ``DATABASE_URL``),
   daphne on its own port, and a Celery worker of its own (``mcp-bar@<host>``, queues cpu and try);
2. puts the kv MCP server (``agentfly/resources/mcp_servers/kv_store.py``) into the demo team's plugin folder
   as ``kv_server.py`` and registers it through ``POST /api/mcp-servers/`` as ``kv_mcp`` (stdio, rollout
   scope, with its ``reset`` and ``seed`` tools), and registers ``grpo_mcp.yaml``'s reward (the status the
   server keeps) through ``POST /api/registry/``; waits until the worker has inspected both;
3. launches one GRPO job per seed through ``POST /api/jobs/`` from ``examples/key_chain/warm_start``, with the
   server's ``lookup`` tool and every setting of ``examples/key_chain/grpo_mcp.yaml`` (read from it) but the
   time budget (``--minutes``), the job's own closing evaluation (``--eval-n`` problems) and the size of the
   server's pool (``--pool``, 32: see ``POOL``); the jobs run one after another on the one worker;
4. evaluates, with ``agentfly eval ... --split test --n <eval-n>`` (greedy, unseen problems), the warm start
   once, with the same MCP tool and reward as the jobs, then each job's last checkpoint (with a pool of
   ``--eval-pool`` sessions: see ``EVAL_POOL``);
5. prints and writes ``<dir>/bar.jsonl``: one line per run (held-out success, tool calls per problem, wall
   seconds; for a job also its steps and the MCP tool calls' latency, p50 and p99, from the trajectories its
   ``samples`` events carry: ``tool_call_ms`` of a rollout's later calls, the server's answer alone, and
   ``first_call_ms``, which includes waiting for a session and seeding it; and the pool's acquire latency from
   its ``resources`` events), then a summary line
   with the points gained in the worst seed. The bar: at least +30 points in each of 3 seeds, within 15
   minutes of GRPO.

Every process it started (the services, the evaluations) is stopped on exit, on success or failure; Ctrl-C
stops it. The exit code is 0 when every job succeeded and its evaluation ran (the bar itself is the summary's
``bar_met``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from webapp import demo  # noqa: E402  (the repository on the path first, so this runs as a plain script)

CONFIG = REPO / "examples" / "key_chain" / "grpo_mcp.yaml"
WARM_START = REPO / "examples" / "key_chain" / "warm_start"
STORE = REPO / "agentfly" / "resources" / "mcp_servers" / "kv_store.py"
SERVER_NAME = "kv_mcp"  # the resource grpo_mcp.yaml's reward reads the walk's status from
SERVER_SCRIPT = "kv_server.py"
REWARD = "agentfly.tools.builtin.mcp_lookup:chain_answer"
WORKER_NAME = "mcp-bar@%h"
REDIS_PREFIX = "mcp-bar:"
BAR_POINTS = 30.0
# Sessions of the server at once. grpo_mcp.yaml keeps one per rollout in flight (16 x 8 = 128); started together,
# 127 of 128 sandboxed servers missed their 60 s start timeout on 2 busy cores, and each such rollout is an
# infrastructure failure left out of the step. 32 start in time and serve the 128 rollouts in turn (a session is
# reset with the server's own tool and handed to the next rollout; rollouts wait up to grpo_mcp.yaml's 300 s).
POOL = 32
# Sessions of an evaluation (``agentfly eval`` runs on this host, outside a job's sandbox): with 32 at once,
# every server died starting ("can't start new thread": the sandbox's RLIMIT_NPROC of 32) on this host, with 8
# every one started. The pool's size changes how long an evaluation takes, never what greedy decoding answers.
EVAL_POOL = 8
FINISHED = ("succeeded", "failed", "cancelled")


class API:
    """The REST API as a client sees it: JSON over HTTP with the user's token."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.token = ""

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.base}{path}", data=data, method=method,
                                         headers={"Content-Type": "application/json", "Accept": "application/json",
                                                  **({"Authorization": f"Token {self.token}"} if self.token else {})})
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            raise SystemExit(f"{method} {path} answered {exc.code}: {exc.read().decode(errors='replace')[:2000]}") from None

    def sign_in(self, username: str, password: str) -> None:
        self.token = self.call("POST", "/api/token/", {"username": username, "password": password})["token"]


def recipe() -> tuple[Any, Any]:
    """grpo_mcp.yaml as a ``Config``, and the ``ResourceSpec`` of its MCP server."""
    from trainer.builders import import_object
    from trainer.config import load_config

    c = load_config(CONFIG)
    return c, import_object(c.resources[SERVER_NAME].spec, f"resources.{SERVER_NAME}.spec")


def pool(size: int) -> dict[str, Any]:
    """The server's pool: ``size`` sessions, and grpo_mcp.yaml's acquire timeout, so that rollouts beyond them
    wait for a session (reset with the server's ``reset`` tool) instead of failing."""
    _, spec = recipe()
    return {SERVER_NAME: {"max": size, "acquire_timeout": spec.acquire_timeout}}


def job_fields(seed: int, minutes: float, eval_n: int, server_id: int, reward_id: int, size: int) -> dict[str, Any]:
    """The launch fields of one seed's job: grpo_mcp.yaml's settings, as the launch form takes them, but the
    pool's size and ``update_threads: 2``, which the form does not take (a cpu job trains on one thread)."""
    c, _ = recipe()
    return {
        "name": f"mcp bar: key chain over MCP, seed {seed}", "team": demo.DEMO_TEAM, "kind": "rl",
        "model_source": "path", "model_path": str(WARM_START), "task": c.data.task, "task_size": c.data.train_size,
        "tools": [], "mcp_tools": [f"{server_id}/lookup"], "reward": reward_id,
        "algorithm": c.algorithm.name, "loss_agg": c.algorithm.loss_agg or "", "steps": c.steps,
        "max_minutes": minutes, "prompts_per_step": c.rollout.prompts_per_step, "group_size": c.rollout.group_size,
        "max_turns": c.rollout.max_turns, "max_new_tokens": c.rollout.max_new_tokens, "learning_rate": c.optim.lr,
        "temperature": c.rollout.temperature, "seed": seed, "eval_size": eval_n, "save_every": c.save_every,
        "queue": "cpu",  # no eval_every in the API: the form's default, 0, is grpo_mcp.yaml's eval.every
        "resources": pool(size),
    }


def wait_until(what: str, poll: Any, services: demo.Services, timeout: float, every: float = 2.0) -> Any:
    """``poll()``'s first truthy answer; exits naming ``what`` after ``timeout`` seconds or if a service died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        services.check()
        if answer := poll():
            return answer
        time.sleep(every)
    raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}; see the logs in {services.logs}")


def inspected(api: API, path: str) -> Any:
    """A poll for ``wait_until``: the object at ``path`` once its inspection has ended (ready or failed)."""
    def poll() -> dict[str, Any] | None:
        now = api.call("GET", path)
        return None if now["status"] == "pending" else now

    return poll


def register(api: API, services: demo.Services, plugins: Path) -> tuple[int, int]:
    """The team's kv server and the reward, registered through the API and inspected by the worker: their ids."""
    shutil.copyfile(STORE, plugins / demo.DEMO_TEAM / SERVER_SCRIPT)
    server = api.call("POST", "/api/mcp-servers/", {
        "team": demo.DEMO_TEAM, "name": SERVER_NAME, "transport": "stdio", "command": [SERVER_SCRIPT],
        "reset_tool": "reset", "seed_tool": "seed"})
    server = wait_until("the worker to inspect the MCP server", inspected(api, f"/api/mcp-servers/{server['id']}/"),
                        services, 180)
    if server["status"] != "ready":
        raise SystemExit(f"the MCP server's inspection failed: {server['error']}")
    tools = [t["name"] for t in server["current_version"]["tools"]]
    print(f"MCP server #{server['id']} {SERVER_NAME} is ready: {', '.join(tools)}", flush=True)
    entry = api.call("POST", "/api/registry/", {"kind": "reward", "import_path": REWARD, "team": demo.DEMO_TEAM})
    entry = wait_until("the worker to describe the reward", inspected(api, f"/api/registry/{entry['id']}/"),
                       services, 180)
    if entry["status"] != "ready":
        raise SystemExit(f"the reward's registration failed: {entry['error']}")
    return int(server["id"]), int(entry["id"])


def run_job(api: API, services: demo.Services, fields: dict[str, Any], minutes: float) -> dict[str, Any]:
    """Launch one job and wait for it to end; the finished job as the API returns it."""
    job = api.call("POST", "/api/jobs/", fields)
    print(f"job #{job['id']} launched: {fields['name']} ({minutes:g} min of GRPO)", flush=True)
    shown: list[Any] = [None, -5]

    def finished() -> dict[str, Any] | None:
        now = api.call("GET", f"/api/jobs/{job['id']}/")
        if now["status"] != shown[0] or now["step"] >= shown[1] + 5:
            shown[:] = [now["status"], now["step"]]
            print(f"  job #{job['id']} {now['status']} at step {now['step']}", flush=True)
        return now if now["status"] in FINISHED else None

    # Loading, the budget, the closing evaluation and the checkpoint, and a worker that is busy starting up.
    return wait_until(f"job #{job['id']} to finish", finished, services, minutes * 60 + 1800, every=5.0)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def job_latencies(api: API, job_id: int) -> dict[str, Any]:
    """The job's MCP tool calls' latency (ms, p50 and p99) from the trajectories of its ``samples`` events, and
    the pool's acquire latency from its last ``resources`` event that has the pool. A rollout's first call also
    waits for its session and seeds it, so first calls and later ones (the server's answer alone) are apart."""
    first: list[float] = []
    later: list[float] = []
    after = 0
    while True:
        page = api.call("GET", f"/api/jobs/{job_id}/events/?types=samples&after={after}&limit=20")
        for event in page["events"]:
            for t in event["data"]["trajectories"]:
                calls = [c["latency"] for c in t.get("tool_calls") or [] if c.get("name") == "lookup"]
                first += calls[:1]
                later += calls[1:]
        if not page["events"]:
            break
        after = page["events"][-1]["seq"]
    pool: dict[str, Any] = {}
    after = 0
    while True:
        page = api.call("GET", f"/api/jobs/{job_id}/events/?types=resources&after={after}&limit=1000")
        for event in page["events"]:
            pool = event["data"].get("pools", {}).get(SERVER_NAME) or pool
        if not page["events"]:
            break
        after = page["events"][-1]["seq"]
    out: dict[str, Any] = {"tool_calls_recorded": len(first) + len(later)}
    for key, calls in (("tool_call_ms", later), ("first_call_ms", first)):
        if calls:
            out[key] = {"p50": round(pct(calls, 50) * 1000, 2), "p99": round(pct(calls, 99) * 1000, 2)}
    if pool:
        out["pool"] = {k: pool.get(k) for k in ("created", "max", "acquires", "failed", "timeouts",
                                                "acquire_p50_ms", "acquire_p99_ms")}
    return out


def evaluate(services: demo.Services, env: dict[str, str], name: str, path: Path, eval_n: int,
             overrides: list[str]) -> dict[str, Any]:
    """``agentfly eval PATH --split test --n EVAL_N``: its last line (JSON), with the seconds it took."""
    argv = [sys.executable, "-m", "trainer.cli", "eval", str(path), "--split", "test", "--n", str(eval_n)]
    for override in overrides:
        argv += ["--set", override]
    start = time.monotonic()
    proc = services.start(f"eval-{name}", argv, env)
    proc.wait()  # interrupted, it stays among the services, which main's finally stops
    services.procs.remove((f"eval-{name}", proc))
    log = (services.logs / f"eval-{name}.log").read_text(errors="replace")
    if proc.returncode != 0:
        raise SystemExit(f"agentfly eval of {path} exited with code {proc.returncode}; its log ends with:\n{log[-3000:]}")
    result = json.loads(log.strip().splitlines()[-1])
    if "eval/accuracy" not in result:  # a problem that failed for the infrastructure says nothing of the agent
        kinds = {k.rsplit("/", 1)[1]: v for k, v in result.items() if k.startswith("eval/rollout/infra_failure/")}
        raise SystemExit(f"every problem of the evaluation of {path} failed for the infrastructure ({kinds}); "
                         f"see {services.logs / f'eval-{name}.log'}")
    result["seconds"] = time.monotonic() - start
    return result


def warm_start_overrides(team: Any, stored_mcp: dict[str, Any]) -> list[str]:
    """``--set`` overrides that give the warm start the jobs' tool and reward: the MCP server as the worker runs
    it (``webapp.mcpservers.jobs.for_job``, the rule checked again), so both sides of the bar read one prompt."""
    from webapp.mcpservers.jobs import for_job

    ran = for_job({"mcp": stored_mcp}, team)["mcp"]
    return ["rollout.tools=[]", f"rollout.reward={REWARD}", f"mcp={json.dumps(ran)}"]


def record(out: Path, row: dict[str, Any]) -> None:
    print(json.dumps(row), flush=True)
    with out.open("a") as fh:
        fh.write(json.dumps(row) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="one job per seed (default 0 1 2)")
    ap.add_argument("--minutes", type=float, default=15.0, help="GRPO time budget of each job (default 15)")
    ap.add_argument("--eval-n", type=int, default=500, help="held-out problems per evaluation (default 500)")
    ap.add_argument("--dir", default=str(REPO / "runs" / "mcp_bar"),
                    help="the stack's database, plugin folder, job folders and logs; bar.jsonl (default runs/mcp_bar)")
    ap.add_argument("--pool", type=int, default=POOL,
                    help=f"MCP server sessions (processes) of each job and evaluation (default {POOL}; "
                         "grpo_mcp.yaml has one per rollout in flight, 128, which do not start within their 60 s "
                         "on 2 busy cores)")
    ap.add_argument("--eval-pool", type=int, default=EVAL_POOL,
                    help=f"MCP server sessions of each evaluation (default {EVAL_POOL}; see EVAL_POOL)")
    ap.add_argument("--port", type=int, default=0, help="web server port (default 0: a free one)")
    args = ap.parse_args(argv)
    bar_dir = Path(args.dir).resolve()
    logs = bar_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    results = bar_dir / "bar.jsonl"
    results.write_text("")
    port = args.port or demo.free_port()
    # Before the settings are read: the worker's queues live under this prefix, away from other deployments'.
    os.environ.setdefault("AGENTFLY_REDIS_PREFIX", REDIS_PREFIX)
    services = demo.Services(logs)
    demo.stop_on_signals()
    began = time.monotonic()
    try:
        env = demo.configure_environment(argparse.Namespace(dir=str(bar_dir), debug=False), services)
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", interactive=False, verbosity=0)
        call_command("collectstatic", interactive=False, verbosity=0)
        _, team = demo.demo_user()
        services.start("worker", [sys.executable, "-m", "celery", "-A", "webapp", "worker", "-Q", "cpu,try,inspect", "-c", "1",
                                  "-l", "info", "-n", WORKER_NAME], env)
        services.start("web", [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                               "webapp.asgi:application"], env)
        base = f"http://127.0.0.1:{port}"
        demo.wait("the web server", lambda: demo.http_ok(f"{base}/login/"), services, 60)
        print(f"web app at {base} (sign in as {demo.DEMO_USER} / {demo.DEMO_PASSWORD}); logs in {logs}", flush=True)
        api = API(base)
        api.sign_in(demo.DEMO_USER, demo.DEMO_PASSWORD)
        server_id, reward_id = register(api, services, Path(os.environ["AGENTFLY_PLUGIN_DIRS"]))

        jobs = []
        for seed in args.seeds:
            start = time.monotonic()
            fields = job_fields(seed, args.minutes, args.eval_n, server_id, reward_id, args.pool)
            job = run_job(api, services, fields, args.minutes)
            if job["status"] != "succeeded":
                raise SystemExit(f"job #{job['id']} (seed {seed}) {job['status']}: {job['error']}")
            checkpoints = api.call("GET", f"/api/jobs/{job['id']}/checkpoints/")
            if not checkpoints:
                raise SystemExit(f"job #{job['id']} (seed {seed}) succeeded without a checkpoint")
            jobs.append((seed, job, Path(max(checkpoints, key=lambda c: c["step"])["path"]), time.monotonic() - start))

        stored = jobs[0][1]["config"]
        eval_pool = f"resources={json.dumps(pool(args.eval_pool))}"
        warm = evaluate(services, env, "warm-start", WARM_START, args.eval_n,
                        [*warm_start_overrides(team, stored["mcp"]), eval_pool])
        first = {"run": "warm start", "accuracy": warm["eval/accuracy"], "tool_calls": warm["eval/tool_calls/mean"],
                 "n": warm["n"], "infra_failed": warm.get("eval/rollout/infra_failed"),
                 "seconds": round(warm["seconds"], 1)}
        record(results, first)
        gains = []
        for seed, job, checkpoint, seconds in jobs:
            result = evaluate(services, env, f"seed{seed}", checkpoint, args.eval_n, [eval_pool])
            gains.append((result["eval/accuracy"] - first["accuracy"]) * 100)
            record(results, {
                "run": f"grpo-seed{seed}", "job": job["id"], "accuracy": result["eval/accuracy"],
                "tool_calls": result["eval/tool_calls/mean"], "n": result["n"],
                "infra_failed": result.get("eval/rollout/infra_failed"), "steps": job["step"],
                "minutes": args.minutes, "seconds": round(seconds + result["seconds"], 1),
                "checkpoint": str(checkpoint), **job_latencies(api, job["id"])})
        worst = min(gains)
        record(results, {"run": "summary", "seeds": args.seeds, "minutes": args.minutes, "n": args.eval_n,
                         "warm_start": first["accuracy"], "worst_seed_points": round(worst, 1),
                         "bar_points": BAR_POINTS, "bar_met": worst >= BAR_POINTS,
                         "wall_seconds": round(time.monotonic() - began, 1)})
        print(f"warm start {first['accuracy']:.3f}; worst seed {worst:+.1f} points "
              f"({'meets' if worst >= BAR_POINTS else 'misses'} the +{BAR_POINTS:g} bar); {results}")
        return 0
    except KeyboardInterrupt:
        print("interrupted: stopping the services", flush=True)
        return 130
    finally:
        services.shutdown()


if __name__ == "__main__":
    sys.exit(main())
