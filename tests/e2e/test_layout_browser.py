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
    # The toolbar shows only while the pointer is over a chart (a page drawn for a phone has none: its buttons
    # would be tap targets under 24 px; a page drawn for the laptop has it).
    page.reload()
    wait_for_js(page, "() => document.body.dataset.history === 'drawn'", timeout=30_000)
    opacity = "() => getComputedStyle(document.querySelector('#chart-reward .modebar')).opacity"
    page.mouse.move(5, 5)
    page.wait_for_timeout(300)
    assert page.evaluate(opacity) == "0"
    page.hover("#chart-reward")
    page.wait_for_timeout(300)
    assert page.evaluate(opacity) == "1"


# --------------------------------------------------------------------------------- buttons follow the state
STATES = {
    # name: (status, fields, checkpoint step or None)
    "queued": ("queued", {}, None),
    "running": ("running", {}, None),
    "yielding": ("running", {"yield_requested": True}, 10),
    "cancelling": ("running", {"cancel_requested": True}, 10),
    "preempted": ("preempted", {}, 20),
    "succeeded": ("succeeded", {}, 40),
    "failed": ("failed", {}, None),
    "cancelled": ("cancelled", {}, None),
    "resumable": ("failed", {}, 30),
    "resumed": ("cancelled", {}, 30),
}


@pytest.fixture
def jobs_in_every_state(alice: Any, transactional_db: None) -> dict[str, Any]:
    from webapp.accounts.models import Team
    from webapp.monitor.synthetic import seed_long_job

    team = Team.objects.of(alice).get()
    jobs = {}
    for name, (status, fields, step) in STATES.items():
        job = make_job(team, alice, f"job {name}", status, step=step or 0, **fields)
        seed_long_job(job, 3)
        if step is not None:
            checkpoint(job, step)
        jobs[name] = job
    # "resumed": a later job continues it from its checkpoint.
    jobs["continuation"] = make_job(team, alice, "job resumed (resumed)", "succeeded",
                                    resumed_from=jobs["resumed"].checkpoints.get())
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


def words(page: Any) -> dict[str, Any]:
    """The state's other words: the link to the job that continued it, why it waits, the missing-worker hint."""
    return page.evaluate("""() => {
      const text = (sel) => { const e = document.querySelector(sel); return e && e.offsetParent !== null ? e.textContent.trim().replace(/\\s+/g, ' ') : null; };
      return {continued: text('#continued-link'), waits: text('#job-queue-reason'), no_worker: text('#job-waiting')};
    }""")


def cancel_question(page: Any) -> str | None:
    """Tap Cancel and say no: the question asked (None: nothing asked). Nothing is cancelled."""
    asked: list[str] = []
    page.once("dialog", lambda dialog: (asked.append(dialog.message), dialog.dismiss()))
    page.click("#cancel-button")
    page.wait_for_timeout(200)
    return asked[0] if asked else None


EXPECTED = {
    "queued": {"badge": "queued", "cancel": "Cancel", "resume": None},
    "running": {"badge": "running", "cancel": "Cancel", "resume": None},
    "yielding": {"badge": "yielding", "cancel": "Cancel", "resume": None},
    "cancelling": {"badge": "cancelling", "cancel": "disabled Cancelling…", "resume": None},
    "preempted": {"badge": "preempted, queued", "cancel": "Cancel", "resume": None},
    "succeeded": {"badge": "succeeded", "cancel": None, "resume": None},
    "failed": {"badge": "failed", "cancel": None, "resume": None},
    "cancelled": {"badge": "cancelled", "cancel": None, "resume": None},
    "resumable": {"badge": "failed", "cancel": None, "resume": "Resume from step 30"},
    "resumed": {"badge": "resumed", "cancel": None, "resume": None},
}
# What Cancel asks, in the words of each state where it works.
QUESTIONS = {
    "queued": "It has not started: it leaves the queue now, and nothing is trained or kept.",
    "running": "It stops after its current step and saves a checkpoint",
    "yielding": "It stops after its current step and saves a checkpoint",
    "preempted": "It waits in the queue to resume from step 20; it ends now, and its checkpoints stay",
}


@pytest.mark.parametrize("size", list(SIZES))
def test_every_state_offers_exactly_the_actions_that_work_and_cancel_asks_in_its_words(
        size: str, alice: Any, jobs_in_every_state: dict[str, Any], daphne: Daphne, browser_page: Any) -> None:
    from webapp.jobs.models import TrainingJob

    page = browser_page
    page.set_viewport_size(SIZES[size])
    sign_in(page, alice, daphne.url)
    problems = watch_for_problems(page, daphne.url)
    seen: dict[str, Any] = {}
    for name, expected in EXPECTED.items():
        job = jobs_in_every_state[name]
        for where, path in (("job page", f"/jobs/{job.pk}/"), ("dashboard", f"/monitor/jobs/{job.pk}/")):
            page.goto(f"{daphne.url}{path}")
            if where == "dashboard":
                wait_for_js(page, "() => document.body.dataset.history === 'drawn'", timeout=30_000)
                want = {**expected, "cancel": "Cancel job" if expected["cancel"] == "Cancel" else expected["cancel"]}
            else:
                want = expected
            seen[f"{name} {where}"] = (controls(page), want)
            said = words(page)
            continued = f"Continued as #{jobs_in_every_state['continuation'].pk}" if name == "resumed" else None
            seen[f"{name} {where}: continued"] = (said["continued"], continued)
            # A waiting job says where it waits and for what (the running jobs hold the cpu queue's worker),
            # and never blames a missing worker when one is only busy.
            waits = said["waits"] is not None and "place" in said["waits"] and "a busy worker" in said["waits"]
            seen[f"{name} {where}: waits"] = (waits, name in ("queued", "preempted"))
            seen[f"{name} {where}: no worker"] = (said["no_worker"], None)
            if name in QUESTIONS:
                question = cancel_question(page) or ""
                seen[f"{name} {where}: asks"] = (QUESTIONS[name] in question and f"#{job.pk}" in question, True)
        if name in ("preempted", "resumed"):
            page.screenshot(path=str(ARTIFACTS / f"{size}-dashboard-{name}.png"))
    assert {k: v for k, (v, want) in seen.items() if v != want} == {}, seen
    # Every question was answered no: nothing was cancelled.
    left = off_loop(lambda: {j.status for j in TrainingJob.objects.filter(
        name__in=["job queued", "job running", "job preempted"])})
    assert left == {"queued", "running", "preempted"}
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
