"""The dashboard as a researcher reads it, in a real browser: every chart has a y-axis title with its unit,
the held-out evaluations are one chart per unit, the rollout viewer shows multi-byte text whole and filters by
reward and by failed tool calls, a resumed job's charts start at its parent's first step, and a job without
resource pools shows its rollout engine's figures. Each page loads with no console error and no failed
request.

Jobs are stored rows with their events (the trainer's payload shapes, ``webapp.monitor.synthetic``); Daphne
serves the pages and headless Debian Chromium drives them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import watch_for_problems
from tests.webapp.helpers import Daphne, off_loop, sign_in, wait_for_js
from trainer.events import metrics_event, resources_event, samples_event

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
WARM_START = ROOT / "examples" / "calculator" / "warm_start"  # a byte-level BPE tokenizer.json
DRAWN = "() => document.body.dataset.history === 'drawn'"
RAW_X = """(id) => Array.from(document.getElementById(id).data.find((t) => t.meta === 'raw').x)"""


def make_job(alice: Any, name: str, **fields: Any) -> Any:
    from webapp.accounts.models import Team
    from webapp.jobs.models import Status, TrainingJob

    return TrainingJob.objects.create(**{"team": Team.objects.of(alice).get(), "created_by": alice, "name": name,
                                         "status": Status.RUNNING, "config": {"steps": 40}, **fields})


def store(job: Any, events: list[dict[str, Any]]) -> None:
    from webapp.monitor.events import append_events

    append_events(job.pk, events)


def open_dashboard(page: Any, daphne: Daphne, alice: Any, job: Any) -> list[str]:
    problems = watch_for_problems(page, daphne.url)
    sign_in(page, alice, daphne.url)
    page.goto(f"{daphne.url}/monitor/jobs/{job.pk}/")
    page.wait_for_function(DRAWN, timeout=30_000)
    return problems


def settle(page: Any, problems: list[str]) -> None:
    page.wait_for_load_state("networkidle")
    assert problems == [] and page.errors == [], problems + page.errors


def job_with_evaluations(alice: Any) -> Any:
    from webapp.monitor.synthetic import seed_long_job

    job = make_job(alice, "with evaluations")
    seed_long_job(job, 30)
    evals = []
    for step, acc in ((10, 0.5), (20, 0.7), (30, 0.9)):
        evals.append(metrics_event(step, {
            "eval/accuracy": acc, "eval/reward/mean": acc, "eval/reward/std": 0.1, "eval/response_length/mean": 30.0,
            "eval/turns/mean": 2.0, "eval/tool_calls/mean": 1.0, "eval/finish/answer": 1.0, "time/eval": 4.0}))
    evals.append(metrics_event(30, {"time/train": 600.0, "time/checkpoint": 0.5}))
    store(job, evals)
    return job


def test_every_chart_has_a_y_axis_title_and_the_evaluations_are_one_chart_per_unit(
        alice: Any, daphne: Daphne, browser_page: Any) -> None:
    job = off_loop(job_with_evaluations, alice)
    page = browser_page
    problems = open_dashboard(page, daphne, alice, job)
    page.click("#more-metrics summary")
    wait_for_js(page, """() => [...document.querySelectorAll('.chart:not([hidden]):not(.summary) .plot')]
        .every((p) => p.querySelector('.main-svg'))""", timeout=15_000)
    wait_for_js(page, "() => document.getElementById('worker-timeline').layout", timeout=15_000)
    axes = page.evaluate("""() => [...document.querySelectorAll('.js-plotly-plot')].map((p) => ({
        id: p.id, title: p.layout.yaxis.title && p.layout.yaxis.title.text,
        right: p.layout.yaxis2 ? p.layout.yaxis2.title.text : null}))""")
    assert len(axes) >= 20, axes
    assert all(a["title"] for a in axes), [a["id"] for a in axes if not a["title"]]
    # One chart per unit holds the evaluation metrics, one curve each across the three evaluations.
    ids = [a["id"] for a in axes]
    assert not [i for i in ids if i.startswith("chart-x-eval")], ids
    curves = page.evaluate("""() => document.getElementById('chart-eval').data.filter((t) => t.meta === 'raw')
        .map((t) => ({name: t.name, x: Array.from(t.x)}))""")
    assert {c["name"] for c in curves} >= {"accuracy", "reward_mean", "finish_answer"}
    assert all(c["x"] == [10, 20, 30] for c in curves), curves
    eval_axes = next(a for a in axes if a["id"] == "chart-eval")
    assert "0–1" in eval_axes["title"] and not eval_axes["right"], eval_axes  # lengths and counts have their own
    # Ranges that fit: the learning rate in scientific notation, counts from 0, the mismatch with its unit.
    layout = page.evaluate("""() => Object.fromEntries(['chart-lr', 'chart-tool_calls', 'chart-mismatch']
        .map((id) => [id, document.getElementById(id).layout.yaxis]))""")
    assert layout["chart-lr"]["tickformat"] == ".1e"
    assert layout["chart-tool_calls"]["rangemode"] == "tozero"
    assert "logprob" in layout["chart-mismatch"]["title"]["text"] and "nats" in layout["chart-mismatch"]["title"]["text"]
    # Stage times have their own chart, without the start-up step or the run's one-off total.
    stage = page.evaluate("""() => document.getElementById('chart-stage_time').data.filter((t) => t.meta === 'raw')
        .map((t) => ({name: t.name, x: Array.from(t.x)}))""")
    assert {s["name"] for s in stage} == {"rollout", "reward", "logprobs", "update", "weight_sync"}
    assert all(s["x"][0] == 2 for s in stage), "the first step (start-up) is left out"
    assert page.evaluate(RAW_X, "chart-step_time")[0] == 2
    settle(page, problems)


def multi_byte_samples() -> list[dict[str, Any]]:
    """Five trajectories as Trajectory.to_dict writes them: rewards 1, 0, 0.5, 1, 0; the second and the
    fifth have a failed calculator call. Their text has characters that span several byte-level tokens."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(WARM_START / "tokenizer.json"))
    out = []
    for i, reward in enumerate([1.0, 0.0, 0.5, 1.0, 0.0]):
        prompt = tok.encode(f"Question {i}: 中文 café?").ids
        reply = tok.encode(f" Réponse {i} 🙂").ids
        failed = i in (1, 4)
        call = {"turn": 0, "name": "calculator", "arguments": {"expression": "1/0" if failed else "2+2"},
                "observation": "" if failed else "4", "error": "division by zero" if failed else None,
                "latency": 0.001}
        out.append({
            "token_ids": prompt + reply, "loss_mask": [0] * len(prompt) + [1] * len(reply),
            "logprobs": [0.0] * len(prompt) + [-0.5] * len(reply), "reward": reward, "num_turns": 1,
            "tool_errors": int(failed), "parse_errors": 0, "finish_reason": "answer", "final_answer": str(i),
            "error": None, "turns": [], "messages": [], "tool_calls": [call],
            "segments": [{"start": 0, "end": len(prompt), "mask": 0, "text": tok.decode(prompt)},
                         {"start": len(prompt), "end": len(prompt) + len(reply), "mask": 1, "text": tok.decode(reply)}],
        })
    return out


def job_with_samples(alice: Any) -> Any:
    job = make_job(alice, "multi-byte samples", config={"steps": 4, "model": {"path": str(WARM_START)}})
    store(job, [metrics_event(1, {"reward/mean": 0.5}),
                samples_event(1, multi_byte_samples())])
    return job


ROLLOUTS = "() => [...document.querySelectorAll('#rollout-list .rollout-item')].map((li) => li.innerText)"
REWARDS = "() => [...document.querySelectorAll('#rollout-list .rollout-item .reward')].map((r) => Number(r.textContent))"


def test_the_rollout_viewer_shows_every_trajectory_multi_byte_text_whole_and_filters(
        alice: Any, daphne: Daphne, browser_page: Any) -> None:
    job = off_loop(job_with_samples, alice)
    page = browser_page
    problems = open_dashboard(page, daphne, alice, job)
    wait_for_js(page, "() => document.querySelectorAll('#rollout-list .rollout-item').length === 5", timeout=15_000)
    tokens = page.inner_text("#token-view")
    assert "中文" in tokens and "café" in tokens and "Réponse 0 🙂" in tokens, tokens
    assert "\ufffd" not in tokens
    # Only the trajectories with a failed tool call.
    page.check("#sample-failed")
    wait_for_js(page, "() => document.querySelectorAll('#rollout-list .rollout-item').length === 2", timeout=5_000)
    failed = page.evaluate(ROLLOUTS)
    assert all("1 failed" in text for text in failed), failed
    assert "error: division by zero" in page.inner_text("#rollout-view")
    page.uncheck("#sample-failed")
    # By reward: at least 1 (the correct ones), then at most 0.5.
    page.fill("#sample-reward-min", "1")
    wait_for_js(page, "() => document.querySelectorAll('#rollout-list .rollout-item').length === 2", timeout=5_000)
    assert page.evaluate(REWARDS) == [1.0, 1.0]
    page.fill("#sample-reward-min", "")
    page.fill("#sample-reward-max", "0.5")
    wait_for_js(page, "() => document.querySelectorAll('#rollout-list .rollout-item').length === 3", timeout=5_000)
    assert sorted(page.evaluate(REWARDS)) == [0.0, 0.0, 0.5]
    settle(page, problems)


def resumed_job(alice: Any) -> Any:
    from webapp.jobs.models import Checkpoint
    from webapp.monitor.synthetic import seed_long_job

    parent = make_job(alice, "first run", status="failed")
    seed_long_job(parent, 12)
    checkpoint = Checkpoint.objects.create(job=parent, step=8, path="/runs/first/step-8")
    child = make_job(alice, "first run (resumed)", resumed_from=checkpoint)
    seed_long_job(child, 4, start_step=9, seed=1)
    return child


def test_a_resumed_jobs_chart_starts_at_its_parents_first_step(alice: Any, daphne: Daphne, browser_page: Any) -> None:
    job = off_loop(resumed_job, alice)
    page = browser_page
    problems = open_dashboard(page, daphne, alice, job)
    assert page.evaluate(RAW_X, "chart-reward") == list(range(1, 13))
    assert page.evaluate(RAW_X, "chart-stage_time")[:8] == [2, 3, 4, 5, 6, 7, 8, 10], \
        "each run's start-up step (1, then 9) is left out of the stage times"
    note = page.inner_text("#lineage-note")
    assert "first run" in note and "step 8" in note
    settle(page, problems)
    # The compare page draws the same joined history.
    page.goto(f"{daphne.url}/monitor/compare/?jobs={job.pk}")
    page.wait_for_function(DRAWN, timeout=30_000)
    wait_for_js(page, "() => document.getElementById('chart-reward').data", timeout=10_000)
    assert page.evaluate(RAW_X, "chart-reward") == list(range(1, 13))
    settle(page, problems)


def job_without_pools(alice: Any) -> Any:
    job = make_job(alice, "no pools")
    host = {"host": "worker-1", "pid": 1, "cpu_count": 2, "cpu_percent": 50.0, "process_cpu_percent": 90.0,
            "process_rss_mb": 900.0, "threads": 4, "memory_used_mb": 4000.0, "memory_total_mb": 8000.0,
            "memory_percent": 50.0, "gpus": [], "gpu_absent": "NVML found no GPU on this machine"}
    store(job, [resources_event(s, {"sequences": 32.0 * s, "generated_tokens": 1234.0 * s, "max_batch": 32.0,
                                    "busy_seconds": 1.5 * s}, {}, host=host, at=1.7e9 + s) for s in (1, 2, 3)])
    return job


def test_the_resource_panel_shows_the_engine_figures_of_a_job_without_pools(
        alice: Any, daphne: Daphne, browser_page: Any) -> None:
    job = off_loop(job_without_pools, alice)
    page = browser_page
    problems = open_dashboard(page, daphne, alice, job)
    wait_for_js(page, "() => document.getElementById('engine-stats')", timeout=10_000)
    assert page.is_visible("#pools-empty") and page.is_visible("#engine-panel")
    table = page.inner_text("#engine-stats")
    assert "generated tokens" in table and "3702" in table and "max batch" in table, table
    wait_for_js(page, "() => document.getElementById('engine-timeline').data", timeout=10_000)
    timeline = page.evaluate("""() => document.getElementById('engine-timeline').data
        .map((t) => ({name: t.name, y: Array.from(t.y)}))""")
    assert {"name": "generated tokens", "y": [1234.0, 2468.0, 3702.0]} in timeline
    assert page.evaluate("() => document.getElementById('engine-timeline').layout.yaxis.title.text")
    settle(page, problems)


def job_with_an_api_pool(alice: Any) -> Any:
    job = make_job(alice, "api pool")
    host = {"host": "worker-1", "pid": 1, "cpu_count": 2, "cpu_percent": 50.0, "process_cpu_percent": 90.0,
            "process_rss_mb": 900.0, "threads": 4, "memory_used_mb": 4000.0, "memory_total_mb": 8000.0,
            "memory_percent": 50.0, "gpus": [], "gpu_absent": "NVML found no GPU on this machine"}
    # A SharedRateLimiter's pool as the resources event carries it: its counters shared in Redis by every
    # process of the team that uses the API, as last read.
    api = {"kind": "api", "size": 1, "max": 1, "in_use": 0, "idle": 1, "waiting": 0, "created": 1, "failed": 0,
           "isolation": {"key": "team-a:search", "shared_in": "redis", "rate_per_s": 5.0, "burst": 5,
                         "concurrency": 4, "daily_quota": 10000, "calls": 812.0, "waits": 37.0, "wait_seconds": 9.5,
                         "http_429": 3.0, "failures": 6.0, "breaker_opened": 1.0, "quota_used": 812,
                         "breaker": "open", "in_flight": 2}}
    store(job, [resources_event(1, {}, {"search_api": api}, host=host, at=1.7e9 + 1)])
    return job


def test_a_rate_limited_apis_pool_shows_calls_waits_429s_the_quota_in_use_and_the_breaker(
        alice: Any, daphne: Daphne, browser_page: Any) -> None:
    page = browser_page
    problems = open_dashboard(page, daphne, alice, off_loop(job_with_an_api_pool, alice))
    wait_for_js(page, "() => document.querySelector('#pool-stats tr.pool-api')", timeout=10_000)
    row = page.inner_text("#pool-stats tr.pool-api")
    for shown in ("812 calls", "37 waits (9.5 s)", "3 × 429", "6 failures", "quota 812 / 10000 today",
                  "5/s, 4 at once", "breaker open"):
        assert shown in row, (shown, row)
    assert page.get_attribute("#pool-stats tr.pool-api td:last-child", "class") == "bad"
    settle(page, problems)


def job_with_a_judge_pool(alice: Any) -> Any:
    job = make_job(alice, "judge pool")
    host = {"host": "worker-1", "pid": 1, "cpu_count": 2, "cpu_percent": 50.0, "process_cpu_percent": 90.0,
            "process_rss_mb": 900.0, "threads": 4, "memory_used_mb": 4000.0, "memory_total_mb": 8000.0,
            "memory_percent": 50.0, "gpus": [], "gpu_absent": "NVML found no GPU on this machine"}
    # A judge's pool as the resources event carries it: the Judge's stats() under ``service``.
    judge = {"kind": "model_service", "size": 1, "max": 1, "in_use": 0, "idle": 1, "waiting": 0, "created": 1,
             "failed": 0, "service": {"calls": 48.0, "batches": 6.0, "max_batch": 16.0, "parse_failures": 5.0,
                                      "errors": 0.0, "max_in_flight": 8.0, "generated_tokens": 900.0,
                                      "in_flight": 0.0, "batch_mean": 8.0, "latency_p50_ms": 412.5,
                                      "latency_p99_ms": 1890.25}}
    store(job, [{"type": "resources", "step": 1, "time": 1.7e9 + 1, "data": {
        "host": host, "pools": {"judge": judge}, "engine": {}}}])
    return job


def test_a_judge_pool_shows_its_calls_batch_sizes_latency_and_parse_failures(
        alice: Any, daphne: Daphne, browser_page: Any) -> None:
    page = browser_page
    problems = open_dashboard(page, daphne, alice, off_loop(job_with_a_judge_pool, alice))
    wait_for_js(page, "() => document.querySelector('#pool-stats tr.pool-service')", timeout=10_000)
    row = page.inner_text("#pool-stats tr.pool-service")
    for shown in ("48 calls", "6 batches (mean size 8, max 16)", "latency p50 412.5 ms, p99 1890.3 ms",
                  "0 in flight (max 8)", "5 parse failures"):
        assert shown in row, (shown, row)
    assert page.get_attribute("#pool-stats tr.pool-service td:last-child", "class") == "bad"
    settle(page, problems)
