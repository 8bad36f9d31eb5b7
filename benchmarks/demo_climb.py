"""Does the demo's reward climb while someone watches? Runs ``python -m webapp.demo`` as a user would and reads
its job's training reward against the seconds since the "watch job" URL was printed.

    python benchmarks/demo_climb.py                      # the demo's default task
    python benchmarks/demo_climb.py --task calculator
    python benchmarks/demo_climb.py --task key_chain --steps 30

Each run gets a fresh ``--dir`` (a temporary folder: its own SQLite database, secret key and checkpoints) and
its own Redis key prefix, so it neither reuses a previous demo's job nor shares a queue with another
deployment on the same Redis. ``DATABASE_URL`` is dropped from the demo's environment for the same reason.
Once the job has finished (``--exit-when-done``), its ``metrics`` events are read from that database through
the web app's own models: the dashboard draws the same events.

The table: per training step, the seconds after the URL line (the event's time), the reward mean of the step's
trajectories and its trailing mean over ``--smooth`` steps; then the held-out evaluations, if any. The verdict
(the issue's bar: "its reward keeps climbing for at least the first 90 s after the URL is printed, and ends
high"): the best smoothed reward in each third of the window (0-30 s, 30-60 s, 60-90 s) beats the best in the
third before it by at least ``--margin`` (a reward that reaches its ceiling at 40 s and stays there fails), and
the final smoothed reward is at least ``--high``. The last line is the verdict; the exit code is 0 only when
both hold. The demo's own output goes to standard error.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
URL_LINE = re.compile(r"watch job\s+(\S+)")
DASHBOARD_LINE = re.compile(r"dashboard\s+\S+/monitor/jobs/(\d+)/")


def run_demo(
    demo_dir: Path, demo_args: list[str], timeout: float
) -> tuple[int, float | None, int | None, float]:
    """Run the demo to the end, echoing its output. Its exit code, the Unix time its URL line appeared (None:
    it never did), the job's id (from the dashboard line) and the wall seconds the whole demo took."""
    argv = [
        sys.executable,
        "-m",
        "webapp.demo",
        "--port",
        "0",
        "--exit-when-done",
        "--dir",
        str(demo_dir),
        *demo_args,
    ]
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("AGENTFLY_REDIS_PREFIX", f"demo-climb-{os.getpid()}-")
    print("$", " ".join(argv), file=sys.stderr, flush=True)
    begin = time.time()
    url_at: float | None = None
    job_id: int | None = None
    proc = subprocess.Popen(
        argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    # SIGTERM: the demo stops its own services (its finally), then its output ends.
    timer = threading.Timer(timeout, proc.terminate)
    timer.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if url_at is None and URL_LINE.search(line):
                url_at = time.time()
            if job_id is None and (m := DASHBOARD_LINE.search(line)):
                job_id = int(m.group(1))
            print(f"  [demo {time.time() - begin:6.1f} s] {line.rstrip()}", file=sys.stderr, flush=True)
        proc.wait()
    finally:
        timer.cancel()
        if proc.poll() is None:
            proc.terminate()
            proc.wait(30)
    return proc.returncode, url_at, job_id, time.time() - begin


def job_metrics(demo_dir: Path, job_id: int) -> list[tuple[int, float, dict[str, Any]]]:
    """``(step, unix time, data)`` of the job's metrics events in order, from the demo's SQLite database."""
    os.environ["DATABASE_URL"] = f"sqlite:///{demo_dir / 'webapp.sqlite3'}"
    os.environ["SECRET_KEY"] = (demo_dir / "secret_key").read_text().strip()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
    import django

    django.setup()
    from webapp.monitor.models import JobEvent

    events = JobEvent.objects.filter(job_id=job_id, type="metrics").order_by("seq")
    return [(e.step if e.step is not None else -1, e.time, e.data) for e in events]


def trailing_mean(values: list[float], n: int) -> list[float]:
    return [
        sum(values[max(0, i - n + 1) : i + 1]) / len(values[max(0, i - n + 1) : i + 1])
        for i in range(len(values))
    ]


def best_in(points: list[tuple[float, float]], lo: float, hi: float) -> float | None:
    inside = [y for t, y in points if lo <= t <= hi]
    return max(inside) if inside else None


def fmt(x: float | None) -> str:
    return "none" if x is None else f"{x:.3f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--task", default=None, help="the demo's --task (default: the demo's own default)")
    ap.add_argument("--steps", type=int, default=None, help="the demo's --steps (default: the demo's own)")
    ap.add_argument(
        "--smooth", type=int, default=5, help="steps in the trailing mean of the reward (default 5)"
    )
    ap.add_argument(
        "--window", type=float, default=90.0, help="seconds the reward must keep climbing (default 90)"
    )
    ap.add_argument(
        "--margin",
        type=float,
        default=0.05,
        help="how much the best smoothed reward of each third of the window must beat the previous third's",
    )
    ap.add_argument("--high", type=float, default=0.8, help="the final smoothed reward that counts as high")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds before the demo is stopped")
    ap.add_argument(
        "--keep", action="store_true", help="keep the demo's --dir (printed) instead of deleting it"
    )
    args = ap.parse_args(argv)

    demo_args = [
        *(["--task", args.task] if args.task else []),
        *(["--steps", str(args.steps)] if args.steps else []),
    ]
    demo_dir = Path(tempfile.mkdtemp(prefix="demo-climb-"))
    try:
        rc, url_at, job_id, wall = run_demo(demo_dir, demo_args, args.timeout)
        if url_at is None or job_id is None:
            print(f"the demo printed no job URL (exit code {rc}); logs in {demo_dir / 'logs'}")
            args.keep = True
            return 1
        rows = [(step, at - url_at, data) for step, at, data in job_metrics(demo_dir, job_id)]
    finally:
        if args.keep:
            print(f"kept {demo_dir}", file=sys.stderr)
        else:
            shutil.rmtree(demo_dir, ignore_errors=True)

    train = [(step, t, float(d["reward/mean"])) for step, t, d in rows if "reward/mean" in d]
    evals = [(step, t, float(d["eval/accuracy"])) for step, t, d in rows if "eval/accuracy" in d]
    smooth = trailing_mean([r for _, _, r in train], args.smooth)
    print(
        f"\ndemo {' '.join(demo_args) or '(defaults)'}: exit code {rc}, {wall:.0f} s in all, "
        f"{len(train)} training steps\n"
    )
    print(f"| seconds after URL | step | reward | reward, mean of last {args.smooth} |")
    print("|---:|---:|---:|---:|")
    for (step, t, r), s in zip(train, smooth, strict=True):
        print(f"| {t:.0f} | {step} | {r:.3f} | {s:.3f} |")
    if evals:
        print("\n| seconds after URL | step | held-out accuracy |\n|---:|---:|---:|")
        for step, t, acc in evals:
            print(f"| {t:.0f} | {step} | {acc:.3f} |")

    curve = [(t, s) for (_, t, _), s in zip(train, smooth, strict=True)]
    third = args.window / 3
    bests = [best_in(curve, i * third, (i + 1) * third) for i in range(3)]
    final = smooth[-1] if smooth else None
    known = [b for b in bests if b is not None]
    climbing = len(known) == 3 and all(later >= earlier + args.margin for earlier, later in pairwise(known))
    high = final is not None and final >= args.high
    spans = ", ".join(f"[{i * third:.0f}, {(i + 1) * third:.0f}] s: {fmt(b)}" for i, b in enumerate(bests))
    print(
        f"\nbest smoothed reward in {spans} (each needs +{args.margin} over the one before); "
        f"final: {fmt(final)} (needs {args.high})"
    )
    print(
        f"verdict: {'climbs' if climbing else 'does NOT climb'} through the first {args.window:.0f} s "
        f"(best smoothed reward per {third:.0f} s: {', '.join(fmt(b) for b in bests)}) and "
        f"{'ends high' if high else 'does NOT end high'} ({fmt(final)})"
    )
    return 0 if climbing and high else 1


if __name__ == "__main__":
    sys.exit(main())
