"""The rollout viewer as a researcher digs through samples: a full-text search over every stored trajectory
of the job finds the steps that hold a phrase and opens them; the shown step's rewards are a histogram; the
best and the worst trajectory of the selected one's group (the same prompt) are side by side.

Sample events in ``Trajectory.to_dict``'s shape are stored for a job; Daphne serves, Debian's Chromium reads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import watch_for_problems
from tests.webapp.helpers import Daphne, off_loop, sign_in, wait_for_js
from trainer.events import metrics_event, samples_event

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.slow]

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "samples"
REWARDS = [1.0, 0.0, 0.5, 0.25]


def trajectory(step: int, i: int) -> dict[str, Any]:
    answer = "needle in a haystack" if (step, i) == (2, 1) else f"answer {step}.{i}"
    return {"group_id": f"g{step}", "rollout_id": f"r{step}.{i}", "reward": REWARDS[i], "num_turns": 1,
            "tool_errors": 0, "parse_errors": 0, "finish_reason": "answer", "final_answer": answer, "error": None,
            "turns": [{"index": 0, "text": f"The answer is {answer}.", "start": 0, "end": 5}], "tool_calls": [],
            "messages": [{"role": "user", "content": f"question {step}"},
                         {"role": "assistant", "content": f"The answer is {answer}."}],
            "token_ids": [], "loss_mask": [], "logprobs": []}


def job_with_samples(alice: Any) -> Any:
    from webapp.accounts.models import Team
    from webapp.jobs.models import TrainingJob
    from webapp.monitor.events import append_events

    job = TrainingJob.objects.create(team=Team.objects.of(alice).get(), created_by=alice, name="samples",
                                     status="succeeded", config={"steps": 3}, step=3)
    for step in (1, 2, 3):
        append_events(job.pk, [metrics_event(step, {"reward/mean": 0.4}),
                               samples_event(step, [trajectory(step, i) for i in range(4)])])
    return job


def open_dashboard(page: Any, alice: Any, daphne: Daphne, job: Any) -> Any:
    """Sign in as alice and open ``job``'s dashboard, watching the page for problems (returned)."""
    problems = watch_for_problems(page, daphne.url)
    sign_in(page, alice, daphne.url)
    page.goto(f"{daphne.url}/monitor/jobs/{job.pk}/")
    return problems


def test_search_finds_the_step_a_phrase_is_in_and_the_viewer_shows_histogram_and_best_vs_worst(
        alice: Any, daphne: Daphne, browser_page: Any) -> None:
    page = browser_page
    problems = open_dashboard(page, alice, daphne, off_loop(job_with_samples, alice))
    wait_for_js(page, "() => document.getElementById('rollout-list').dataset.seq", timeout=30_000)
    # The newest step is shown first; its rewards are the histogram's.
    wait_for_js(page, "() => document.getElementById('reward-histogram').data", timeout=10_000)
    assert sorted(page.evaluate("() => Array.from(document.getElementById('reward-histogram').data[0].x)")) == sorted(REWARDS)
    page.fill("#sample-search", "NEEDLE in a")
    page.click("#sample-search-form button")
    wait_for_js(page, "() => document.querySelectorAll('.search-hit').length === 1", timeout=10_000)
    assert page.inner_text(".search-hit") == "step 2 (1)"
    wait_for_js(page, "() => document.querySelectorAll('#rollout-list .rollout-item').length === 1", timeout=10_000)
    assert "needle in a haystack" in page.inner_text("#rollout-view")
    assert "1 of 4 at this step" in page.inner_text("#sample-count")
    # Clear the search: the step's four trajectories; best vs worst of the group side by side.
    page.fill("#sample-search", "")
    page.click("#sample-search-form button")
    wait_for_js(page, "() => document.querySelectorAll('#rollout-list .rollout-item').length === 4", timeout=10_000)
    page.click("#best-worst")
    columns = page.locator("#side-by-side > div")
    assert columns.count() == 2
    assert columns.nth(0).inner_text().startswith("best of its group: reward 1")
    assert columns.nth(1).inner_text().startswith("worst of its group: reward 0")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.locator("#side-by-side").screenshot(path=str(ARTIFACTS / "best-vs-worst.png"))
    page.wait_for_load_state("networkidle")
    assert problems == [] and page.errors == []


def test_a_search_too_short_is_refused_naming_the_rule(alice: Any, alice_job: Any) -> None:
    from django.test import Client

    client = Client()
    client.force_login(alice)
    answer = client.get(f"/monitor/jobs/{alice_job.pk}/samples/search.json?q=a")
    assert answer.status_code == 400 and "2 to 200 characters" in answer.json()["error"]


HOSTILE = '<img src=x onerror="window.pwned=1"> the host killed the sandbox'


def job_with_failures_and_turn_rewards(alice: Any) -> Any:
    """One step of three: a scored two-turn trajectory with a reward on each turn, a one-turn one without, and
    one a killed sandbox ended (its reason carries markup, which must show as text)."""
    from webapp.accounts.models import Team
    from webapp.jobs.models import TrainingJob
    from webapp.monitor.events import append_events

    credited = {**trajectory(1, 0), "rollout_id": "credited", "num_turns": 2, "reward": 1.0,
                "turns": [{"index": 0, "text": "lookup k1", "start": 0, "end": 2},
                          {"index": 1, "text": "The answer is 7.", "start": 3, "end": 5}],
                "messages": [{"role": "user", "content": "follow the chain"},
                             {"role": "assistant", "content": "lookup k1"},
                             {"role": "tool", "content": "k2"},
                             {"role": "assistant", "content": "The answer is 7."}],
                "turn_rewards": [{"turn": 0, "value": 0.25, "reason": "found k1"},
                                 {"turn": 1, "value": -0.1, "reason": "late"}]}
    plain = {**trajectory(1, 1), "rollout_id": "plain", "reward": 0.5}
    ended = {**trajectory(1, 2), "rollout_id": "ended", "reward": 0.0, "finish_reason": "error",
             "error": "InfrastructureFailure: sandbox killed", "failure": "killed", "failure_reason": HOSTILE}
    job = TrainingJob.objects.create(team=Team.objects.of(alice).get(), created_by=alice, name="infra",
                                     status="succeeded", config={"steps": 1}, step=1)
    append_events(job.pk, [metrics_event(1, {"reward/mean": 0.75}),
                           samples_event(1, [credited, plain, ended])])
    return job


def test_the_viewer_marks_infrastructure_failures_left_out_filters_them_and_shows_each_turns_reward(
        alice: Any, daphne: Daphne, browser_page: Any) -> None:
    page = browser_page
    problems = open_dashboard(page, alice, daphne, off_loop(job_with_failures_and_turn_rewards, alice))
    wait_for_js(page, "() => document.querySelectorAll('#rollout-list .rollout-item').length === 3", timeout=30_000)
    # The first trajectory is shown: each assistant turn with the reward credited to it.
    assert page.locator("#rollout-view .turn-reward").all_inner_texts() == [
        "turn reward +0.250 · found k1 +0.250", "turn reward -0.100 · late -0.100"]
    # Its histogram is of what was trained on: the killed one is left out, and says so.
    wait_for_js(page, "() => document.getElementById('reward-histogram').data", timeout=10_000)
    assert sorted(page.evaluate("() => Array.from(document.getElementById('reward-histogram').data[0].x)")) == [0.5, 1.0]
    assert "1 left out: infrastructure failure" in page.evaluate(
        "() => document.getElementById('reward-histogram').layout.title.text")
    assert page.locator("#rollout-list .badge.infra").all_inner_texts() == ["left out: killed"]
    # Only infrastructure failures: the killed one, with its kind and its reason as plain text.
    page.check("#sample-infra")
    wait_for_js(page, "() => document.querySelectorAll('#rollout-list .rollout-item').length === 1", timeout=10_000)
    notice = page.locator("#rollout-view .infra-failure")
    assert "infrastructure failure: killed" in notice.inner_text()
    assert "left out of training: infrastructure failure" in notice.inner_text()
    assert page.inner_text("#rollout-view .infra-reason") == HOSTILE
    assert page.locator("#rollout-view img").count() == 0 and page.evaluate("() => window.pwned") is None
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.locator("#rollout-view").screenshot(path=str(ARTIFACTS / "infrastructure-failure.png"))
    page.uncheck("#sample-infra")
    wait_for_js(page, "() => document.querySelectorAll('#rollout-list .rollout-item').length === 3", timeout=10_000)
    assert problems == [] and page.errors == []
