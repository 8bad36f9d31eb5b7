"""Reading the pages, in a real browser at a laptop's size (1440 x 900) and a phone's (390 x 844): tables wrap
words, never one letter per line; every tap target on the phone's dashboard is at least 24 px (WCAG 2.2);
the job list searches by name and the keyboard shortcuts work (``/`` search, ``?`` help); a dark theme follows
the system's, charts included; a log axis says what it leaves out; the held-out evaluation draws its problem
count on its own axis and starts at step 0. Screenshots land in ``test-artifacts/reading/``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import watch_for_problems
from tests.webapp.factories import builtin_entries
from tests.webapp.helpers import Daphne, sign_in, wait_for_js
from trainer.events import metrics_event

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts" / "reading"
LAPTOP, PHONE = {"width": 1440, "height": 900}, {"width": 390, "height": 844}

# Per table cell: how many lines its text takes, and how many it may take with whole words (one per word or
# <wbr> part); a cell over its allowance wraps inside words.
SQUEEZED_CELLS = """(sel) => [...document.querySelectorAll(sel)].flatMap((td) => {
  if (!td.offsetParent || !td.textContent.trim()) return [];
  const tops = [];
  const walker = document.createTreeWalker(td, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const range = document.createRange(); range.selectNodeContents(node);
    for (const r of range.getClientRects()) if (r.width > 0) tops.push(r.top);
  }
  tops.sort((a, b) => a - b);
  const lines = tops.filter((t, i) => i === 0 || t - tops[i - 1] > 6).length;  // a line is a band of tops
  const parts = td.textContent.trim().split(/\\s+/).length + td.querySelectorAll('wbr').length;
  return lines > parts ? [`${td.textContent.trim().slice(0, 40)}: ${lines} lines for ${parts} words`] : [];
})"""

# Every control a finger taps, visible, and smaller than 24 x 24 px (a link inside running text is exempt).
SMALL_TARGETS = """() => [...document.querySelectorAll('a[href], button, input:not([type=hidden]), select, summary, textarea')]
  .filter((e) => e.offsetParent !== null && getComputedStyle(e).visibility !== 'hidden')
  .filter((e) => !(e.tagName === 'A' && getComputedStyle(e).display === 'inline' && e.parentElement.closest('p, li, td, dd, span.muted, h1, .empty')))
  .map((e) => [e, e.getBoundingClientRect()])
  .filter(([, r]) => r.width > 0 && (r.width < 23.5 || r.height < 23.5))
  .map(([e, r]) => `${e.tagName.toLowerCase()}#${e.id || ''}.${e.className || ''} "${(e.textContent || e.value || '').trim().slice(0, 20)}" ${Math.round(r.width)}x${Math.round(r.height)}`)"""


@pytest.fixture
def jobs(alice: Any, transactional_db: None) -> dict[str, Any]:
    """alice's team: a run with 40 steps of history and evaluations from step 0 (64 problems each), and two
    seeds of a calculator run to compare (their lr in the table)."""
    from webapp.accounts.models import Team
    from webapp.jobs.models import TrainingJob
    from webapp.monitor.events import append_events
    from webapp.monitor.synthetic import seed_long_job

    builtin_entries()
    team = Team.objects.of(alice).get()

    def job(name: str, status: str, lr: float) -> Any:
        return TrainingJob.objects.create(team=team, created_by=alice, name=name, status=status, step=40,
                                          config={"steps": 40, "optim": {"lr": lr}, "rollout": {"group_size": 4}})

    run = job("calculator-grpo seed 1", "running", 1e-6)
    seed_long_job(run, 40)
    append_events(run.pk, [metrics_event(s, {"eval/accuracy": a, "eval/reward/mean": a, "eval/problems": 64.0})
                           for s, a in ((0, 0.55), (10, 0.6), (20, 0.7), (30, 0.8), (40, 0.9))])
    other = job("calculator-grpo seed 2", "succeeded", 3e-6)
    seed_long_job(other, 40, seed=1)
    job("key-chain rloo", "succeeded", 1e-5)
    return {"run": run, "other": other}


def test_the_job_list_searches_by_name_and_the_keyboard_shortcuts_work(
        alice: Any, jobs: dict[str, Any], daphne: Daphne, browser_page: Any) -> None:
    page = browser_page
    page.set_viewport_size(LAPTOP)
    sign_in(page, alice, daphne.url)
    problems = watch_for_problems(page, daphne.url)
    page.goto(f"{daphne.url}/jobs/")
    page.keyboard.press("/")
    assert page.evaluate("() => document.activeElement.id") == "job-search"
    page.keyboard.type("SEED")  # case does not matter
    page.keyboard.press("Enter")
    page.wait_for_url("**/jobs/?q=SEED*")
    names = page.locator("#job-table tbody tr td:nth-child(2) > a").all_inner_texts()
    assert sorted(names) == ["calculator-grpo seed 1", "calculator-grpo seed 2"]
    page.locator("body").click(position={"x": 5, "y": 300})  # out of the box: keys are shortcuts again
    page.keyboard.press("?")
    assert page.locator("#shortcuts-help").is_visible()
    assert "search this page" in page.inner_text("#shortcuts-help")
    page.screenshot(path=str(_artifacts() / "laptop-shortcuts.png"))
    page.keyboard.press("Escape")
    assert not page.locator("#shortcuts-help").is_visible()
    page.goto(f"{daphne.url}/monitor/jobs/{jobs['run'].pk}/")
    wait_for_js(page, "() => document.body.dataset.history === 'drawn'", timeout=30_000)
    page.keyboard.press("/")
    assert page.evaluate("() => document.activeElement.id") == "metric-search"
    assert problems == []


def test_tables_wrap_words_not_letters_and_every_phone_tap_target_is_24_px(
        alice: Any, jobs: dict[str, Any], daphne: Daphne, browser_page: Any) -> None:
    page = browser_page
    sign_in(page, alice, daphne.url)
    problems = watch_for_problems(page, daphne.url)
    run, other = jobs["run"], jobs["other"]
    squeezed: dict[str, list[str]] = {}
    page.set_viewport_size(LAPTOP)
    page.goto(f"{daphne.url}/monitor/compare/?jobs={run.pk},{other.pk}")
    wait_for_js(page, "() => document.body.dataset.history === 'drawn'", timeout=30_000)
    squeezed["compare at 1440"] = page.evaluate(SQUEEZED_CELLS, "#hyperparameters td, #config-diff td")
    page.screenshot(path=str(_artifacts() / "laptop-compare.png"), full_page=True)
    page.set_viewport_size(PHONE)
    page.goto(f"{daphne.url}/registry/")
    squeezed["registry at 390"] = page.evaluate(SQUEEZED_CELLS, "table td")
    # Status, the last column, is on the screen, not scrolled out of it.
    right = page.evaluate("() => Math.max(...[...document.querySelectorAll('table td:last-child')].map((td) => td.getBoundingClientRect().right))")
    assert right <= PHONE["width"], right
    page.screenshot(path=str(_artifacts() / "phone-registry.png"), full_page=True)
    assert {k: v for k, v in squeezed.items() if v} == {}
    small: dict[str, list[str]] = {}
    for name, path in (("dashboard", f"/monitor/jobs/{run.pk}/"), ("jobs", "/jobs/")):
        page.goto(f"{daphne.url}{path}")
        if name == "dashboard":
            wait_for_js(page, "() => document.body.dataset.history === 'drawn'", timeout=30_000)
            page.click("#more-metrics summary")  # the extra charts' tools too
            page.wait_for_timeout(500)
        small[name] = page.evaluate(SMALL_TARGETS)
        page.screenshot(path=str(_artifacts() / f"phone-{name}.png"), full_page=name == "jobs")
    assert {k: v for k, v in small.items() if v} == {}
    assert problems == []


def test_the_dark_theme_follows_the_system_and_the_charts_say_what_a_log_axis_hides(
        alice: Any, jobs: dict[str, Any], daphne: Daphne, browser_page: Any) -> None:
    page = browser_page
    page.set_viewport_size(LAPTOP)
    page.emulate_media(color_scheme="dark")
    sign_in(page, alice, daphne.url)
    problems = watch_for_problems(page, daphne.url)
    page.goto(f"{daphne.url}/monitor/jobs/{jobs['run'].pk}/")
    wait_for_js(page, "() => document.body.dataset.history === 'drawn'", timeout=30_000)
    colours = page.evaluate("""() => {
      const rgb = (c) => c.startsWith('#') ? [1, 3, 5].map((i) => parseInt(c.slice(i, i + 2), 16)) : c.match(/\\d+/g).map(Number);
      const lum = (c) => { const [r, g, b] = rgb(c); return (0.2126 * r + 0.7152 * g + 0.0722 * b) / 255; };
      const card = getComputedStyle(document.querySelector('.card')).backgroundColor;
      const plot = document.getElementById('chart-reward');
      return {body: lum(getComputedStyle(document.body).backgroundColor), card: lum(card),
              ink: lum(getComputedStyle(document.body).color), chartInk: lum(plot._fullLayout.font.color),
              chartPaper: plot._fullLayout.paper_bgcolor};
    }""")
    assert colours["body"] < 0.15 and colours["card"] < 0.2 and colours["ink"] > 0.7, colours
    assert colours["chartInk"] > 0.7 and colours["chartPaper"] in ("rgba(0, 0, 0, 0)", "rgba(0,0,0,0)"), colours
    # The held-out chart: accuracy from the warm start's step 0, the problem count on the right-hand axis.
    evaluation = page.evaluate("""() => Object.fromEntries(document.getElementById('chart-eval').data
      .filter((t) => t.meta === 'raw').map((t) => [t.name, {axis: t.yaxis || 'y', first: t.x[0]}]))""")
    assert evaluation["accuracy"] == {"axis": "y", "first": 0}, evaluation
    assert evaluation["problems"]["axis"] == "y2", evaluation
    page.screenshot(path=str(_artifacts() / "laptop-dashboard-dark.png"))
    # Log scale: the policy loss has values below 0, which a log axis cannot draw; the chart says so.
    page.check("#smooth-toggle")
    page.check("#log-toggle")
    note = page.locator("#charts .chart[data-chart='loss'] .chart-note")
    note.wait_for(state="visible", timeout=5_000)
    assert "at or below 0 not drawn; smoothing off" in note.inner_text()
    page.locator("#charts .chart[data-chart='loss']").screenshot(path=str(_artifacts() / "laptop-log-note.png"))
    page.uncheck("#log-toggle")
    assert not note.is_visible()
    assert problems == []


def _artifacts() -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS
