"""Runs in groups in Chromium, served by Daphne: a sweep launched from its page lands on its group page, which
draws its runs in parallel coordinates and each run's curve and names the best run; the compare page draws
seeds as one mean curve with a band, std or min-max. At a laptop's and a phone's size; screenshots land in
``test-artifacts/groups/``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import watch_for_problems
from tests.e2e.pagecheck import SIZES, layout_problems
from tests.webapp.factories import builtin_entries, launch_tiny_job
from tests.webapp.helpers import Daphne, sign_in, wait_for_js
from trainer.events import metrics_event

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.slow]

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "groups"


@pytest.fixture
def swept(alice: Any, alice_api: Any, team_a: Any, transactional_db: None) -> dict[str, Any]:
    """A finished base job and a sweep of three seeds from it, each run with a reward curve."""
    from webapp.jobs.models import TrainingJob
    from webapp.monitor.events import append_events
    from webapp.sweeps.actions import do_launch_sweep

    tool, reward = builtin_entries()
    base = TrainingJob.objects.get(pk=launch_tiny_job(alice_api, {"calculator": tool, "math_equal": reward},
                                                      name="base"))
    TrainingJob.objects.filter(pk=base.pk).update(status="succeeded")
    sweep = do_launch_sweep(user=alice, base=base, name="seeds", kind="grid", space={"seed": [0, 1, 2]},
                            metric="reward/mean")
    jobs = [r.job for r in sweep.runs.all()]
    for i, job in enumerate(jobs):
        append_events(job.pk, [metrics_event(s, {"reward/mean": 0.1 * s + 0.05 * i}) for s in range(1, 21)])
    TrainingJob.objects.filter(pk__in=[j.pk for j in jobs]).update(status="succeeded")
    return {"base": base, "sweep": sweep, "jobs": jobs}


def test_a_sweep_and_seed_bands_are_drawn_on_their_pages_at_both_sizes(
        alice: Any, swept: dict[str, Any], daphne: Daphne, browser_page: Any) -> None:
    page = browser_page
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.set_viewport_size(SIZES["laptop"])
    sign_in(page, alice, daphne.url)
    problems = watch_for_problems(page, daphne.url)

    page.goto(f"{daphne.url}/sweeps/new/?base={swept['base'].pk}")
    page.fill("#id_name", "lr grid")
    page.fill("#id_space", '{"learning_rate": [0.0001, 0.0003]}')
    page.click("#sweep-form button[type=submit]")
    page.wait_for_url(lambda url: "/new/" not in url)
    assert page.locator("#sweep-runs tbody tr").count() == 2
    assert "2 runs are queued" in page.inner_text(".messages")

    sweep = swept["sweep"]
    best = swept["jobs"][2].pk  # the highest reward
    shots: dict[str, list[str]] = {}
    for size in SIZES:
        page.set_viewport_size(SIZES[size])
        page.goto(f"{daphne.url}/sweeps/{sweep.pk}/")
        wait_for_js(page, "() => document.querySelector('#sweep-charts').dataset.drawn === '3'", timeout=30_000)
        assert f"#{best}" in page.inner_text("#best-run")
        # One line per run across the axes (seed, then the metric), each axis named on the chart.
        assert page.locator("#sweep-parcoords .scatterlayer .trace").count() == 3
        assert {"seed", "reward/mean"} <= set(page.evaluate(
            "() => [...document.querySelectorAll('#sweep-parcoords .annotation-text')].map(e => e.textContent)"))
        assert page.locator("#sweep-curves .scatterlayer .trace").count() == 3
        page.screenshot(path=str(ARTIFACTS / f"{size}-sweep.png"), full_page=True)
        shots[f"{size} sweep"] = layout_problems(page)

        ids = ",".join(str(j.pk) for j in swept["jobs"])
        page.goto(f"{daphne.url}/monitor/compare/?jobs={ids}")
        wait_for_js(page, "() => document.querySelector('#seed-bands').dataset.drawn === '1'", timeout=30_000)
        # One group: the band's two edges and the mean line.
        assert page.locator("#band-chart .scatterlayer .trace").count() == 3
        page.select_option("#band-kind", "minmax")
        wait_for_js(page, "() => document.querySelector('#band-chart').data[1].y[0] < 0.11", timeout=10_000)
        page.locator("#seed-bands").scroll_into_view_if_needed()
        page.screenshot(path=str(ARTIFACTS / f"{size}-compare.png"), full_page=True)
        shots[f"{size} compare"] = [p for p in layout_problems(page) if "band" in p or "wide" in p]
    assert {k: v for k, v in shots.items() if v} == {}
    assert problems == []
