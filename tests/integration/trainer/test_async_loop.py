"""Asynchronous training (``rollout.mode=async``) on the tiny model: a producer thread samples ahead, every
trained batch is at most ``max_staleness`` versions old, the loss is corrected with TIS by default, and a
resumed run trains the prompts the uninterrupted one did."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer.checkpoint import load_state
from trainer.config import load_config
from trainer.events import CallbackSink
from trainer.loop import Trainer

ROOT = Path(__file__).resolve().parents[3]
REWARD = "rollout.reward=rewards_for_tests:answer_length"
ASYNC = ("rollout.mode=async", "rollout.max_staleness=1")


def _run(config_overrides: list[str], resume: str | None = None) -> list[dict]:
    events: list[dict] = []
    Trainer(load_config(None, config_overrides), sinks=[CallbackSink(events.append)], resume=resume).train()
    return events


def _steps(events: list[dict]) -> dict[int, dict]:
    return {e["step"]: e["data"] for e in events if e["type"] == "metrics" and "time/step" in e["data"]}


def _prompts(events: list[dict]) -> dict[int, list[str]]:
    """The task samples each step trained on, from its ``samples`` event (every trajectory is logged)."""
    return {
        e["step"]: sorted(json.dumps(t["sample"], sort_keys=True) for t in e["data"]["trajectories"])
        for e in events
        if e["type"] == "samples"
    }


@pytest.mark.slow
def test_an_async_run_trains_batches_at_most_max_staleness_versions_old_with_tis(
    tiny_model_dir, tmp_path, tiny_overrides
):
    # A large step size: each update moves the policy far enough that a one-version-old batch is off-policy.
    events = _run(tiny_overrides(tiny_model_dir, tmp_path, REWARD, "steps=4", "optim.lr=0.01", *ASYNC))
    steps = _steps(events)
    assert sorted(steps) == [1, 2, 3, 4]
    # The first batch is sampled by the starting weights, before any update: on-policy.
    assert steps[1]["rollout/staleness_max"] == 0.0
    for s in steps.values():
        assert 0.0 <= s["rollout/staleness_mean"] <= s["rollout/staleness_max"] <= 1.0
        assert s["rollout/dropped_stale"] == 0.0
        assert s["time/wait_for_batch"] >= 0.0 and s["time/producer_idle"] >= 0.0
        assert s["time/rollout"] > 0.0  # the producer's generation time of that batch
        # auto is TIS in async mode: its weights and truncated share are measured.
        assert s["off_policy/weight_max"] <= 2.0 + 1e-6
        assert 0.0 <= s["off_policy/truncated_fraction"] <= 1.0
    # The first batch's weights are the trainer's (ratio 1 up to numerics); later ones were sampled by the
    # weights before the last update, and the importance weights measure that gap against their logprobs.
    assert steps[1]["off_policy/weight_mean"] == pytest.approx(1.0, abs=1e-3)
    assert max(abs(steps[s]["off_policy/weight_mean"] - 1.0) for s in (2, 3, 4)) > 1e-3
    status = [e["data"]["state"] for e in events if e["type"] == "status"]
    assert status[-1] == "succeeded"


@pytest.mark.slow
def test_an_async_run_resumed_at_step_2_trains_the_prompts_of_the_uninterrupted_run(
    tiny_model_dir, tmp_path, tiny_overrides
):
    common = (REWARD, "steps=4", "save_every=2", "keep_last=5", "log_samples=4", *ASYNC)
    whole = _run(tiny_overrides(tiny_model_dir, tmp_path / "whole", *common))
    ckpt = tmp_path / "whole" / "checkpoint-000002"
    state = load_state(ckpt)
    # The checkpoint's cursor is after the 2 trained batches of 2 prompts, whatever the producer had drawn.
    assert state["data"] == {"epoch": 0, "position": 4}
    assert state["producer"]["next_step"] >= 2
    assert state["producer"]["cursor"]["position"] == 2 * state["producer"]["next_step"]
    resumed = _run(tiny_overrides(tiny_model_dir, tmp_path / "resumed", *common), resume=str(ckpt))
    before, after = _prompts(whole), _prompts(resumed)
    assert sorted(after) == [3, 4]
    assert after[3] == before[3] and after[4] == before[4]
    assert after[3] != before[2]  # no batch trained twice


@pytest.mark.vllm
@pytest.mark.timeout(900)
def test_an_async_run_on_vllm_samples_on_the_producer_loads_each_new_version_there_and_evaluates_on_hf(
    tiny_model_dir, tmp_path, tiny_overrides
):
    pytest.importorskip("vllm")
    import threading

    events: list[dict] = []
    config = load_config(None, tiny_overrides(tiny_model_dir, tmp_path, REWARD, "engine=vllm", "steps=3",
                                              "optim.lr=0.01", "eval.every=1", *ASYNC))
    trainer = Trainer(config, sinks=[CallbackSink(events.append)])
    vllm = trainer.engine
    loads: list[tuple[str, float]] = []
    generating: set[str] = set()
    load, generate = vllm.update_weights, vllm.generate

    def update_weights(state):  # what the producer loads into vLLM, and from which thread
        loads.append((threading.current_thread().name, float(next(iter(state.values())).float().sum())))
        load(state)

    async def spied_generate(prompt_ids, sampling):
        generating.add(threading.current_thread().name)
        return await generate(prompt_ids, sampling)

    vllm.update_weights, vllm.generate = update_weights, spied_generate
    trainer.train()

    steps = _steps(events)
    assert sorted(steps) == [1, 2, 3]
    assert steps[1]["rollout/staleness_max"] == 0.0
    assert all(s["rollout/staleness_max"] <= 1.0 and s["rollout/dropped_stale"] == 0.0 for s in steps.values())
    # vLLM sampled every batch on the producer's thread; the trainer never stepped it (its evaluations ran on
    # an HF engine over its own module), and every new version reached vLLM through load_weights, there.
    assert generating == {"rollout-producer"}
    assert loads and {name for name, _ in loads} == {"rollout-producer"}
    assert len({checksum for _, checksum in loads}) == len(loads)  # each load a new version
    # The first batch was sampled by vLLM with the starting weights: its logprobs are the trainer's, up to
    # vLLM's own kernels.
    assert steps[1]["logprob_mismatch"] < 0.05
    evals = [e["step"] for e in events if e["type"] == "metrics" and "eval/accuracy" in e["data"]]
    assert evals == [0, 1, 2, 3]  # step 0: the starting weights
    resources = [e["data"]["engine"] for e in events if e["type"] == "resources"]
    assert all("steps" in r for r in resources)  # the producer's engine is vLLM: its own stats


def test_an_async_run_that_evaluates_every_step_never_holds_more_pooled_instances_than_the_pool_max(tmp_path):
    # The producer samples with its pools while the trainer evaluates: both must draw on the same pools, or
    # a job configured for N simulators runs 2N during every evaluation.
    from pooled_tools_for_tests import Counted

    Counted.forget()
    config = load_config(ROOT / "examples/calculator/grpo.yaml", [
        f"model.path={ROOT / 'examples/calculator/warm_start'}", f"output_dir={tmp_path}", "steps=3", "threads=1",
        "update_threads=1", "progress=false", "max_minutes=null", "rollout.prompts_per_step=4",
        "rollout.group_size=2", "data.eval_size=8", "eval.every=1", "save_every=0", *ASYNC,
        "rollout.tools=[pooled_tools_for_tests:calculator]",
        "resources={counted: {spec: 'pooled_tools_for_tests:COUNTED', max: 1}}",
    ])
    events: list[dict] = []
    trainer = Trainer(config, sinks=[CallbackSink(events.append)])
    trainer.train()
    evals = [e["data"] for e in events if e["type"] == "metrics" and "eval/accuracy" in e["data"]]
    pools = [e["data"]["pools"]["counted"] for e in events if e["type"] == "resources"]
    trained = [e["data"] for e in events if e["type"] == "metrics" and "tool_calls/mean" in e["data"]]
    # The evaluations and the producer's rollouts both called the tool, and it worked: the pool served them.
    assert len(evals) >= 3 and max(e["eval/tool_calls/mean"] for e in evals) > 0
    assert max(t["tool_calls/mean"] for t in trained) > 0
    assert all(e["eval/tool_error_rate"] == 0 for e in evals) and all(t["tool_errors/mean"] == 0 for t in trained)
    assert pools and max(p["acquires"] for p in pools) > 0  # the producer's pools are the ones reported
    assert Counted.peak == 1  # never a second instance: one pool, shared
    assert Counted.started == 1  # kept across steps and evaluations
    assert Counted.alive == 0  # and stopped when the run ended
