"""Dashboard open time against history length: a stored job of N steps (a metrics, a samples and a resources
event per step) opened in headless Chromium, navigation to every chart drawn, beside an empty job's page.

The whole real path runs: Daphne serving the page, ``series.json`` (min/max-downsampled columns read from
PostgreSQL), Plotly drawing every chart, the websocket joining live from the history's ``last_seq``. The
empty job's page (Plotly loading, the socket, no history) is the baseline measured in the same run; the last
line is the ratio of the longest job's open time to it.

    python benchmarks/dashboard_open.py                     # 0, 1,000, 5,000 and 20,000 steps
    python benchmarks/dashboard_open.py --steps 20000 --repeat 3

Needs PostgreSQL (``--database-url``, default a database ``agentfly_bench`` on 127.0.0.1, created if absent),
Redis (``--redis-url``) and ``/usr/bin/chromium`` with the ``playwright`` package.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.websocket_latency import free_port, start_daphne  # noqa: E402


def setup_django(database_url: str, redis_url: str) -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = "webapp.settings"
    os.environ.setdefault("DEBUG", "1")
    os.environ["DATABASE_URL"] = database_url
    os.environ["REDIS_URL"] = redis_url
    name = database_url.rsplit("/", 1)[-1]
    base = database_url.rsplit("/", 1)[0]
    subprocess.run(["psql", f"{base}/postgres", "-qc", f"CREATE DATABASE {name}"], capture_output=True)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def make_jobs(steps: list[int]) -> tuple[Any, dict[int, int], str]:
    """A user, a team and one stored job per history length; returns (user, {steps: job id}, session)."""
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.test import Client

    from webapp.accounts.models import do_create_team
    from webapp.jobs.models import Status, TrainingJob
    from webapp.monitor.synthetic import seed_long_job

    name = f"bench-{uuid.uuid4().hex[:8]}"
    user = get_user_model().objects.create_user(username=name, password=uuid.uuid4().hex)
    team = do_create_team(name, user)
    jobs = {}
    for n in steps:
        job = TrainingJob.objects.create(team=team, created_by=user, name=f"{n} steps", config={"steps": n},
                                         status=Status.SUCCEEDED, step=n)
        if n:
            seed_long_job(job, n)
        jobs[n] = job.pk
    client = Client()
    client.force_login(user)
    return user, jobs, client.cookies[settings.SESSION_COOKIE_NAME].value


def open_times(url: str, cookie: tuple[str, str], jobs: dict[int, int], repeat: int) -> dict[int, list[dict]]:
    from playwright.sync_api import sync_playwright

    results: dict[int, list[dict]] = {n: [] for n in jobs}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium", headless=True,
                                     args=["--headless", "--no-sandbox", "--disable-gpu"])
        context = browser.new_context(viewport={"width": 1440, "height": 1800})
        context.add_cookies([{"name": cookie[0], "value": cookie[1], "url": url}])
        page = context.new_page()
        page.goto(f"{url}/monitor/jobs/{jobs[min(jobs)]}/")  # warm Daphne and the browser's cache of Plotly
        page.wait_for_function("() => document.body.dataset.history === 'drawn'", timeout=120_000)
        for _ in range(repeat):
            for n, job_id in jobs.items():
                page.goto(f"{url}/monitor/jobs/{job_id}/")
                page.wait_for_function("() => document.body.dataset.history === 'drawn'", timeout=120_000)
                results[n].append(page.evaluate("""() => ({drawn: window.agentflyDashboard.drawnAt,
                    ...window.agentflyDashboard.timings})"""))
        browser.close()
    return results


def main(argv: list[str] | None = None) -> float:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, nargs="+", default=[1000, 5000, 20000], help="history lengths")
    ap.add_argument("--repeat", type=int, default=1, help="opens per job (the median is shown)")
    ap.add_argument("--database-url", default=os.environ.get("BENCH_DATABASE_URL",
                                                            "postgres://postgres@127.0.0.1:5432/agentfly_bench"))
    ap.add_argument("--redis-url", default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/14"))
    args = ap.parse_args(argv)
    setup_django(args.database_url, args.redis_url)
    from django.conf import settings

    started = time.perf_counter()
    _, jobs, session = make_jobs([0, *sorted(set(args.steps))])
    seeded = time.perf_counter() - started
    port = free_port()
    log = Path(tempfile.mkdtemp(prefix="dash-bench-")) / "daphne.log"
    daphne = start_daphne(port, log)
    try:
        results = open_times(f"http://127.0.0.1:{port}", (settings.SESSION_COOKIE_NAME, session), jobs, args.repeat)
    finally:
        daphne.terminate()
        daphne.wait(15)
    print(f"seeded {sum(jobs)} steps ({3 * sum(jobs)} events) in {seeded:.1f} s; median of {args.repeat} open(s); "
          "ms after navigation")
    print(f"{'steps':>7} {'events':>7} {'script start':>13} {'history in':>11} {'charts drawn':>13} {'all drawn':>10}")
    medians = {}
    for n, runs in results.items():
        def med(key: str, runs: list[dict] = runs) -> float:
            return statistics.median(r[key] for r in runs)

        medians[n] = med("drawn")
        print(f"{n:>7} {3 * n:>7} {med('start'):>13.0f} {med('fetched'):>11.0f} {med('charts'):>13.0f} "
              f"{medians[n]:>10.0f}")
    longest = max(jobs)
    ratio = medians[longest] / max(medians[0], 1e-9)
    print(f"open time of a {longest}-step job / an empty job's: {ratio:.2f}x")
    return ratio


if __name__ == "__main__":
    main()
