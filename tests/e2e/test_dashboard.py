"""The dashboard in a real browser: a tiny CPU job trains on a real Celery worker, Daphne serves the page and
its websocket, and headless Debian Chromium (driven by Playwright) watches it grow, then cancels it.

Needs ``/usr/bin/chromium`` (``apt-get install -y chromium``) and the ``playwright`` package; the browser that
``playwright install`` would download is never used. The screenshot lands in ``test-artifacts/``.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.webapp.helpers import ROOT, Daphne, off_loop, sign_in, wait_for, wait_for_js
from trainer.events import metrics_event

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.slow]

ARTIFACTS = ROOT / "test-artifacts"



def register_and_wait(api: Any, kind: str, import_path: str) -> dict[str, Any]:
    """Register a team entry through the API and wait for the worker to inspect it."""
    entry = api.post("/api/registry/", {"kind": kind, "import_path": import_path, "team": "team-a"},
                     format="json").json()
    return wait_for(lambda: (e := api.get(f"/api/registry/{entry['id']}/").json())["status"] != "pending" and e,
                    60, f"the worker to inspect {import_path}")


@pytest.mark.timeout(900)  # its waits add up to ten minutes
def test_the_dashboard_grows_live_shows_rollouts_and_pools_and_cancels_the_job(
        alice: Any, alice_api: Any, builtins: dict[str, Any], daphne: Daphne, browser_page: Any) -> None:
    from webapp.jobs.models import Status, TrainingJob
    from webapp.monitor.models import JobEvent

    # The job's python pool is really used: the tool declares it, and the team's reward leases a sandbox from
    # it on every rollout (a random tiny model never calls a tool by itself).
    reward = off_loop(register_and_wait, alice_api, "reward", "team_tools:same_answer_in_a_sandbox")
    assert reward["status"] == "ready", reward["error"]
    response = off_loop(lambda: alice_api.post("/api/jobs/", {
        "name": "tiny live", "team": "team-a", "tools": [builtins["calculator"].pk, builtins["python_code"].pk],
        "reward": reward["id"], "steps": 300, "prompts_per_step": 2, "group_size": 2,
        "max_turns": 2, "max_new_tokens": 12, "eval_size": 2, "save_every": 0, "resources": {"python": {"max": 2}},
    }, format="json"))
    assert response.status_code == 201, response.content
    job_id = response.json()["id"]
    page = browser_page
    sign_in(page, alice, daphne.url)
    ARTIFACTS.mkdir(exist_ok=True)

    page.goto(f"{daphne.url}/monitor/jobs/{job_id}/")
    wait_for_js(page, "document.getElementById('connection').dataset.state === 'live'", timeout=30_000)
    at_load = int(page.get_attribute("#chart-reward", "data-points") or 0)

    # At least ten reward points arrive live, without a reload.
    wait_for_js(page, f"Number(document.getElementById('chart-reward').dataset.points) >= {at_load + 10}", timeout=300_000)
    assert page.url.endswith(f"/monitor/jobs/{job_id}/")

    # The plotted numbers are the stored numbers, in step order.
    plotted = page.evaluate("""() => {
        const raw = document.getElementById('chart-reward').data.find((t) => t.mode === 'lines+markers');
        return {x: Array.from(raw.x), y: Array.from(raw.y)};
    }""")
    stored = off_loop(lambda: {e.step: e.data["reward/mean"]
                               for e in JobEvent.objects.filter(job_id=job_id, type="metrics")})
    assert plotted["x"] == sorted(plotted["x"])
    assert plotted["y"] == [pytest.approx(stored[s]) for s in plotted["x"]]

    # A trajectory with trained (mask 1) and masked (mask 0) tokens coloured apart, logprobs on hover.
    page.wait_for_selector("#token-view .tok.m1", timeout=60_000)
    colours = page.evaluate("""() => ['m0', 'm1'].map((m) => getComputedStyle(
        document.querySelector('#token-view .tok.' + m)).backgroundColor)""")
    assert colours[0] != colours[1]
    title = page.get_attribute("#token-view .tok.m1", "title") or ""
    assert "logprob" in title
    assert page.locator("#token-view .tok.m0").count() > 0

    # Pool bars and the pool table show the worker's own python pool: two sandboxes at most, made and leased
    # by the rollouts (each step's four rewards lease one), with measured acquire times.
    wait_for_js(page, "document.querySelectorAll('#pool-bars .barlayer .point').length > 0", timeout=60_000)
    row = page.locator("#pool-stats tbody tr").first
    cells = [c.strip() for c in row.locator("td").all_inner_texts()]
    assert page.locator("#pool-stats tbody tr").count() == 1
    assert cells[0] == "python" and cells[1].endswith("/ 2"), cells
    assert int(cells[5]) >= 1, cells  # created
    p50, p99 = (float(ms) for ms in cells[7].split(" / "))  # numbers, not "—": acquires were timed
    assert p99 > 0 and p50 <= p99, cells
    assert page.inner_text("#gpu-absent").startswith("absent")
    page.screenshot(path=str(ARTIFACTS / "monitor-dashboard.png"), full_page=True)
    pools = off_loop(lambda: [e.data["pools"] for e in JobEvent.objects.filter(job_id=job_id, type="resources")])
    assert pools and all(p["python"]["acquires"] >= 4 and p["python"]["created"] >= 1 for p in pools), pools

    # Cancel from the page; the status badge changes live.
    page.once("dialog", lambda dialog: dialog.accept())  # the dashboard asks before it cancels
    page.click("#cancel-button")
    wait_for_js(page, "document.getElementById('job-status').dataset.status === 'cancelled'",
                           timeout=180_000)
    page.screenshot(path=str(ARTIFACTS / "monitor-dashboard-cancelled.png"), full_page=True)
    assert not page.errors, page.errors
    # The page hears "cancelled" from the training process's last status event; the worker finishes the
    # job's row just after it.
    job = off_loop(lambda: wait_for(lambda: TrainingJob.objects.filter(pk=job_id).exclude(status=Status.RUNNING)
                                    .first(), 60, "the job's row to leave running"))
    assert job.status == Status.CANCELLED and job.step < 300
    # The cancelled job saved a checkpoint on its way out: Resume is offered at once, without a reload, from it.
    wait_for_js(page, "!document.getElementById('resume-form').hidden", timeout=30_000)
    last = off_loop(lambda: TrainingJob.objects.get(pk=job_id).last_checkpoint)
    assert page.inner_text("#resume-button") == f"Resume from step {last.step}"
    assert (ARTIFACTS / "monitor-dashboard.png").stat().st_size > 10_000


def test_a_page_whose_server_restarts_reconnects_and_resumes_without_gap_or_duplicate(
        alice: Any, alice_job: Any, daphne: Daphne, browser_page: Any) -> None:
    from webapp.monitor.events import append_events

    def metrics(steps: range) -> None:
        off_loop(append_events, alice_job.pk, [metrics_event(s, {"reward_mean": s / 10}) for s in steps])

    page = browser_page
    sign_in(page, alice, daphne.url)
    metrics(range(1, 6))
    page.goto(f"{daphne.url}/monitor/jobs/{alice_job.pk}/")
    wait_for_js(page, "document.getElementById('chart-reward').dataset.points === '5'", timeout=30_000)

    daphne.stop()
    wait_for_js(page, "document.getElementById('connection').dataset.state === 'reconnecting'",
                           timeout=30_000)
    metrics(range(6, 9))  # stored while the page cannot hear anything
    daphne.start()
    wait_for_js(page, "document.getElementById('connection').dataset.state === 'live'", timeout=60_000)
    metrics(range(9, 11))  # live again
    wait_for_js(page, "document.getElementById('chart-reward').dataset.points === '10'", timeout=30_000)
    plotted = page.evaluate("""() => {
        const raw = document.getElementById('chart-reward').data.find((t) => t.mode === 'lines+markers');
        return {x: Array.from(raw.x), y: Array.from(raw.y)};
    }""")
    assert plotted["x"] == list(range(1, 11))
    assert plotted["y"] == [pytest.approx(s / 10) for s in range(1, 11)]
    assert "last #10" in page.inner_text("#event-count")
    assert not page.errors, page.errors


def test_the_compare_page_overlays_several_jobs_and_the_toggles_change_only_the_display(
        alice: Any, alice_job: Any, daphne: Daphne, browser_page: Any) -> None:
    from webapp.jobs.models import TrainingJob
    from webapp.monitor.events import append_events

    other = off_loop(lambda: TrainingJob.objects.create(team=alice_job.team, created_by=alice, name="baseline",
                                                        config={}))
    for job, scale in ((alice_job, 1.0), (other, 2.0)):
        off_loop(append_events, job.pk, [metrics_event(s, {"reward_mean": scale * s, "kl": 0.01 * s})
                                         for s in range(1, 8)])
    page = browser_page
    sign_in(page, alice, daphne.url)
    page.goto(f"{daphne.url}/monitor/compare/?jobs={alice_job.pk},{other.pk}")
    wait_for_js(page, """() => {
        const div = document.getElementById('chart-reward');
        return div.data && div.data.filter((t) => t.mode === 'lines+markers' && t.x.length === 7).length === 2;
    }""", timeout=30_000)
    names = page.evaluate("""() => document.getElementById('chart-reward').data
        .filter((t) => t.mode === 'lines+markers').map((t) => t.name)""")
    assert names == [f"#{alice_job.pk} tiny arithmetic", f"#{other.pk} baseline"]

    page.check("#log-toggle")
    assert page.evaluate("document.getElementById('chart-kl').layout.yaxis.type") == "log"
    page.check("#smooth-toggle")
    wait_for_js(page, """() => document.getElementById('chart-reward').data
        .some((t) => t.name.endsWith('(smoothed)') && t.visible === true)""", timeout=5_000)
    raw = page.evaluate("""() => document.getElementById('chart-reward').data
        .filter((t) => t.mode === 'lines+markers').map((t) => Array.from(t.y))""")
    assert raw == [[float(s) for s in range(1, 8)], [2.0 * s for s in range(1, 8)]], "smoothing never alters data"
    assert not page.errors, page.errors
