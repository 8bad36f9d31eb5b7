"""Every page at a phone's size (390 x 844) and a laptop's (1440 x 900): the document is never wider than the
screen, and no text lies outside its container (the nav bar, a card, the page head). Tables may be wider
than a phone: they scroll inside their card. Buttons and badges follow the job's state on the job page and
the dashboard, at each state and after live updates.

The jobs are stored rows with a real history (``webapp.monitor.synthetic``: the trainer's payloads); a
screenshot of every page at both sizes lands in ``test-artifacts/layout/``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import watch_for_problems
from tests.webapp.factories import builtin_entries
from tests.webapp.helpers import Daphne, off_loop, sign_in, wait_for_js
from trainer.events import checkpoint_event, log_event, metrics_event, status_event

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts" / "layout"
SIZES = {"phone": {"width": 390, "height": 844}, "laptop": {"width": 1440, "height": 900}}
LONG_NAME = "key-chain grpo with a rather long descriptive name to wrap"

# Each text node's box inside its container; a table cell's or a scrolling box's text is exempt (it scrolls
# inside its card); SVG text is Plotly's, clipped by its own viewport.
OUT_OF_PLACE = """() => {
  const out = [];
  const root = document.documentElement;
  if (root.scrollWidth > root.clientWidth + 1) out.push(`the page is ${root.scrollWidth} px wide on a ${root.clientWidth} px screen`);
  const containers = '.card, .topbar, .page-head, .messages, .status-row';
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    if (!node.textContent.trim()) continue;
    const el = node.parentElement;
    if (!el || el.closest('svg, td, th, option, script, style, template, select, details:not([open]) > :not(summary)')) continue;
    const range = document.createRange(); range.selectNodeContents(node);
    const r = range.getBoundingClientRect();
    if (r.width === 0 && r.height === 0) continue;
    let container = null, exempt = false;
    for (let a = el; a && a !== document.body; a = a.parentElement) {
      if (a.matches(containers)) { container = a; break; }
      const ox = getComputedStyle(a).overflowX;
      if (a !== el && (ox === 'auto' || ox === 'scroll')) { exempt = true; break; }
    }
    if (exempt) continue;
    const c = container ? container.getBoundingClientRect() : { left: 0, top: -1e9, right: root.clientWidth, bottom: 1e9 };
    if (r.left < c.left - 1 || r.right > c.right + 1 || r.top < c.top - 1 || r.bottom > c.bottom + 1) {
      out.push(`"${node.textContent.trim().slice(0, 40)}" at x ${Math.round(r.left)}..${Math.round(r.right)}, y ${Math.round(r.top)}..${Math.round(r.bottom)} ` +
               `outside ${container ? container.className || container.tagName : 'the screen'} x ${Math.round(c.left)}..${Math.round(c.right)}`);
    }
  }
  return out;
}"""


def make_job(team: Any, alice: Any, name: str, status: str, **fields: Any) -> Any:
    from webapp.jobs.models import TrainingJob

    return TrainingJob.objects.create(team=team, created_by=alice, name=name, status=status,
                                      config={"steps": 40, "rollout": {"group_size": 4}}, **fields)


def checkpoint(job: Any, step: int) -> None:
    from webapp.jobs.models import Checkpoint

    Checkpoint.objects.create(job=job, step=step, path=f"/srv/agentfly/runs/team-a/job-{job.pk}/checkpoints/step-{step:06d}")


@pytest.fixture
def site(alice: Any, transactional_db: None) -> dict[str, Any]:
    """alice's team with a long job (40 steps of history, evaluations, checkpoints), a finished one to compare
    it with, and the built-in calculator and math_equal."""
    from webapp.accounts.models import Team
    from webapp.monitor.events import append_events
    from webapp.monitor.synthetic import seed_long_job

    tool, _reward = builtin_entries()
    team = Team.objects.of(alice).get()
    long = make_job(team, alice, LONG_NAME, "running", step=40)
    seed_long_job(long, 40)
    append_events(long.pk, [metrics_event(s, {"eval/accuracy": a, "eval/reward/mean": a})
                            for s, a in ((10, 0.4), (20, 0.6), (30, 0.7), (40, 0.8))])
    append_events(long.pk, [log_event(40, "x" * 300)])
    checkpoint(long, 20)
    other = make_job(team, alice, "calculator-grpo seed 1", "succeeded", step=40,
                     final_metrics={"eval/accuracy": 0.81, "reward/mean": 0.77, "time/train": 321.5})
    seed_long_job(other, 40, seed=1)
    return {"team": team, "long": long, "other": other, "tool": tool}


def pages(site: dict[str, Any]) -> dict[str, str]:
    long, other = site["long"], site["other"]
    return {
        "landing": "/", "jobs": "/jobs/", "launch": "/jobs/launch/", "job": f"/jobs/{long.pk}/",
        "job-finished": f"/jobs/{other.pk}/", "dashboard": f"/monitor/jobs/{long.pk}/",
        "compare": f"/monitor/compare/?jobs={long.pk},{other.pk}", "registry": "/registry/",
        "entry": f"/registry/{site['tool'].pk}/", "register": "/registry/register/", "teams": "/accounts/teams/",
        "team": f"/accounts/teams/{site['team'].slug}/", "token": "/accounts/token/",
    }


@pytest.mark.parametrize("size", list(SIZES))
def test_every_page_fits_the_screen_with_its_text_inside_its_containers(
        size: str, alice: Any, site: dict[str, Any], daphne: Daphne, browser_page: Any) -> None:
    page = browser_page
    page.set_viewport_size(SIZES[size])
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    bad: dict[str, list[str]] = {}
    for name, path in [("signed-out", "/"), ("login", "/login/")]:
        page.goto(f"{daphne.url}{path}")
        page.screenshot(path=str(ARTIFACTS / f"{size}-{name}.png"), full_page=True)
        bad[name] = page.evaluate(OUT_OF_PLACE)
    sign_in(page, alice, daphne.url)
    problems = watch_for_problems(page, daphne.url)
    for name, path in pages(site).items():
        page.goto(f"{daphne.url}{path}")
        page.wait_for_load_state("networkidle")
        if name in ("dashboard", "compare"):
            wait_for_js(page, "() => document.body.dataset.history === 'drawn'", timeout=30_000)
            page.wait_for_timeout(600)  # the resource and worker panels draw on the next tick
        page.screenshot(path=str(ARTIFACTS / f"{size}-{name}.png"), full_page=True)
        bad[name] = page.evaluate(OUT_OF_PLACE)
        if "{#" in page.inner_text("body") or "{%" in page.inner_text("body"):
            bad[name].append("template syntax shown as text")
    assert {k: v for k, v in bad.items() if v} == {}
    assert problems == []


def test_the_charts_are_as_wide_as_their_card_on_a_phone_and_resize_with_the_window(
        alice: Any, site: dict[str, Any], daphne: Daphne, browser_page: Any) -> None:
    page = browser_page
    page.set_viewport_size(SIZES["phone"])
    sign_in(page, alice, daphne.url)
    page.goto(f"{daphne.url}/monitor/jobs/{site['long'].pk}/")
    wait_for_js(page, "() => document.body.dataset.history === 'drawn'", timeout=30_000)
    widths = "() => [...document.querySelectorAll('#charts .chart:not([hidden])')].map((c) => [c.clientWidth, c.querySelector('.main-svg').getBoundingClientRect().width])"
    for chart, svg in page.evaluate(widths):
        assert chart <= 370 and svg <= chart, (chart, svg)
    page.set_viewport_size(SIZES["laptop"])
    # Three charts a row now, each plot as wide as its box (a phone's box is one column).
    wait_for_js(page, """() => { const boxes = [...document.querySelectorAll('#charts .chart:not([hidden])')].slice(0, 3);
        const plot = document.querySelector('#chart-reward');
        const w = plot.querySelector('.main-svg').getBoundingClientRect().width;
        return boxes.every((b) => b.offsetTop === boxes[0].offsetTop) && Math.abs(w - plot.clientWidth) < 2; }""",
                timeout=10_000)
    # The toolbar shows only while the pointer is over a chart.
    opacity = "() => getComputedStyle(document.querySelector('#chart-reward .modebar')).opacity"
    page.mouse.move(5, 5)
    page.wait_for_timeout(300)
    assert page.evaluate(opacity) == "0"
    page.hover("#chart-reward")
    page.wait_for_timeout(300)
    assert page.evaluate(opacity) == "1"


# --------------------------------------------------------------------------------- buttons follow the state
STATES = {
    # name: (status, cancel_requested, checkpoint step or None)
    "queued": ("queued", False, None),
    "running": ("running", False, None),
    "cancelling": ("running", True, 10),
    "succeeded": ("succeeded", False, 40),
    "failed": ("failed", False, None),
    "cancelled": ("cancelled", False, None),
    "resumable": ("failed", False, 30),
}


@pytest.fixture
def jobs_in_every_state(alice: Any, transactional_db: None) -> dict[str, Any]:
    from webapp.accounts.models import Team
    from webapp.monitor.synthetic import seed_long_job

    team = Team.objects.of(alice).get()
    jobs = {}
    for name, (status, cancelling, step) in STATES.items():
        job = make_job(team, alice, f"job {name}", status, cancel_requested=cancelling, step=step or 0)
        seed_long_job(job, 3)
        if step is not None:
            checkpoint(job, step)
        jobs[name] = job
    return jobs


def controls(page: Any) -> dict[str, Any]:
    """What the user sees of the state: the badge, Cancel (shown, enabled, its text), Resume (shown, text)."""
    return page.evaluate("""() => {
      const shown = (sel) => { const e = document.querySelector(sel); return Boolean(e && e.offsetParent !== null); };
      const cancel = document.getElementById('cancel-button'), resume = document.getElementById('resume-button');
      return {badge: document.getElementById('job-status').textContent.trim().toLowerCase(),
              cancel: shown('#cancel-button') ? (cancel.disabled ? 'disabled ' : '') + cancel.textContent.trim() : null,
              resume: shown('#resume-button') ? resume.textContent.trim().replace(/\\s+/g, ' ') : null};
    }""")


EXPECTED = {
    "queued": {"badge": "queued", "cancel": "Cancel", "resume": None},
    "running": {"badge": "running", "cancel": "Cancel", "resume": None},
    "cancelling": {"badge": "running", "cancel": "disabled Cancelling…", "resume": None},
    "succeeded": {"badge": "succeeded", "cancel": None, "resume": None},
    "failed": {"badge": "failed", "cancel": None, "resume": None},
    "cancelled": {"badge": "cancelled", "cancel": None, "resume": None},
    "resumable": {"badge": "failed", "cancel": None, "resume": "Resume from step 30"},
}


@pytest.mark.parametrize("size", list(SIZES))
def test_cancel_and_resume_are_shown_only_when_they_would_work_at_every_state(
        size: str, alice: Any, jobs_in_every_state: dict[str, Any], daphne: Daphne, browser_page: Any) -> None:
    page = browser_page
    page.set_viewport_size(SIZES[size])
    sign_in(page, alice, daphne.url)
    problems = watch_for_problems(page, daphne.url)
    seen: dict[str, Any] = {}
    for name, job in jobs_in_every_state.items():
        expected = EXPECTED[name]
        page.goto(f"{daphne.url}/jobs/{job.pk}/")
        seen[f"{name} job page"] = (controls(page), expected)
        page.goto(f"{daphne.url}/monitor/jobs/{job.pk}/")
        wait_for_js(page, "() => document.body.dataset.history === 'drawn'", timeout=30_000)
        on_dashboard = {**expected, "cancel": expected["cancel"] and expected["cancel"].replace("Cancel", "Cancel job", 1)
                        if expected["cancel"] == "Cancel" else expected["cancel"]}
        seen[f"{name} dashboard"] = (controls(page), on_dashboard)
        if name == "resumable":
            page.screenshot(path=str(ARTIFACTS / f"{size}-dashboard-resumable.png"))
    assert {k: v for k, (v, want) in seen.items() if v != want} == {}, seen
    assert problems == []


def end_job(job_id: int, status: str) -> None:
    from webapp.jobs.models import TrainingJob
    from webapp.monitor.events import append_events

    TrainingJob.objects.filter(pk=job_id).update(status=status)
    append_events(job_id, [checkpoint_event(20, "/tmp/ckpt-20"), status_event(20, status)])


def test_after_live_updates_the_controls_follow_the_job_and_the_live_badge_stops_when_it_ends(
        alice: Any, alice_job: Any, daphne: Daphne, browser_page: Any) -> None:
    from webapp.jobs.models import Checkpoint

    page = browser_page
    sign_in(page, alice, daphne.url)
    problems = watch_for_problems(page, daphne.url)
    page.goto(f"{daphne.url}/monitor/jobs/{alice_job.pk}/")
    wait_for_js(page, "() => document.getElementById('connection').dataset.state === 'live'", timeout=20_000)
    assert controls(page) == {"badge": "running", "cancel": "Cancel job", "resume": None}
    off_loop(lambda: Checkpoint.objects.create(job_id=alice_job.pk, step=20, path="/tmp/ckpt-20"))
    off_loop(end_job, alice_job.pk, "cancelled")
    wait_for_js(page, "() => document.getElementById('job-status').dataset.status === 'cancelled'", timeout=10_000)
    assert controls(page) == {"badge": "cancelled", "cancel": None, "resume": "Resume from step 20"}
    wait_for_js(page, "() => document.getElementById('connection').dataset.state === 'ended'", timeout=10_000)
    assert "live" not in page.inner_text("#connection")
    # The job page follows by itself too (it polls while the job is active, and stops once it is not).
    page.goto(f"{daphne.url}/jobs/{alice_job.pk}/")
    assert controls(page) == {"badge": "cancelled", "cancel": None, "resume": "Resume from step 20"}
    assert problems == []


def test_the_job_page_drops_cancel_and_shows_the_end_when_a_running_job_finishes(
        alice: Any, alice_job: Any, daphne: Daphne, browser_page: Any) -> None:
    page = browser_page
    sign_in(page, alice, daphne.url)
    page.goto(f"{daphne.url}/jobs/{alice_job.pk}/")
    assert controls(page)["cancel"] == "Cancel"
    off_loop(end_job, alice_job.pk, "succeeded")
    wait_for_js(page, "() => document.getElementById('job-status').dataset.status === 'succeeded'", timeout=10_000)
    assert controls(page) == {"badge": "succeeded", "cancel": None, "resume": None}
