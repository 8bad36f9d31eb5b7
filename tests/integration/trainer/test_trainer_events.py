"""The trainer's event contract on a real two-step run: a checkpoint event for every save, the shared status
vocabulary, and resources events that carry the host, the rollout engine's stats and the pools."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer.config import load_config
from trainer.events import RUN_STATES, CallbackSink, Event
from trainer.loop import Trainer

pytestmark = pytest.mark.slow


def test_every_save_is_a_checkpoint_event_and_every_step_reports_the_engine(tiny_model_dir, tiny_overrides, tmp_path):
    events: list[Event] = []
    config = load_config(None, tiny_overrides(tiny_model_dir, tmp_path / "run", "save_every=1", "keep_last=5",
                                              "rollout.reward=rewards_for_tests:answer_length"))
    result = Trainer(config, sinks=[CallbackSink(events.append)]).train()

    saves = [e["data"] for e in events if e["type"] == "checkpoint"]
    assert [s["step"] for s in saves] == [1, 2]  # step 1 by save_every, step 2 the final save
    assert all(Path(s["path"]).is_dir() for s in saves) and saves[-1]["path"] == result["checkpoint"]
    assert saves[-1]["score"] is not None  # the final save follows the final evaluation

    states = [e["data"]["state"] for e in events if e["type"] == "status"]
    assert set(states) <= set(RUN_STATES) and states[-1] == result["state"] == "succeeded"

    resources = [e["data"] for e in events if e["type"] == "resources"]
    assert len(resources) == 2
    engine = resources[-1]["engine"]
    assert engine["sequences"] >= 4 and engine["generated_tokens"] > 0  # 2 steps x 2 prompts x 2 samples
    assert {"cpu_percent", "process_rss_mb", "gpus", "gpu_absent"} <= set(resources[-1]["host"])


@pytest.mark.vllm
def test_with_the_vllm_engine_the_resources_events_carry_its_stats(tiny_model_dir, tiny_overrides, tmp_path):
    pytest.importorskip("vllm")
    events: list[Event] = []
    config = load_config(None, tiny_overrides(tiny_model_dir, tmp_path / "run", "steps=1", "engine=vllm",
                                              "rollout.reward=rewards_for_tests:answer_length"))
    Trainer(config, sinks=[CallbackSink(events.append)]).train()
    (resources,) = [e["data"] for e in events if e["type"] == "resources"]
    # Before Engine.stats(), the trainer read a dataclass's as_dict() and got {} from vLLM's plain dict.
    assert resources["engine"]["sequences"] == 4 and resources["engine"]["generated_tokens"] > 0
    assert resources["engine"]["steps"] >= 1


def test_the_periodic_eval_logs_pass_at_1_turns_and_tool_errors_and_pass_at_k_only_when_configured(
        tiny_model_dir, tiny_overrides, tmp_path):
    def evals(*extra: str) -> list[dict]:
        events: list[Event] = []
        config = load_config(None, tiny_overrides(tiny_model_dir, tmp_path / f"run{len(extra)}", "eval.every=1",
                                                  "data.eval_size=2", *extra))
        Trainer(config, sinks=[CallbackSink(events.append)]).train()
        return [dict(e["data"], step=e["step"]) for e in events if e["type"] == "metrics" and "eval/accuracy" in e["data"]]

    plain = evals()
    # Step 0 is the starting weights' (the curve's first point), then every step, the last being the final one.
    assert [m["step"] for m in plain] == [0, 1, 2]
    for m in plain:
        assert m["eval/pass_at_1"] == m["eval/accuracy"] and m["eval/mean_turns"] >= 1
        assert 0.0 <= m["eval/tool_error_rate"] <= 1.0
        assert not any(k.startswith("eval/sampled/") for k in m)  # pass@k costs rollouts: off by default
    sampled = evals("eval.pass_k=[1, 2]", "eval.samples=3", "eval.temperature=0.9")
    assert [m["step"] for m in sampled] == [0, 1, 2]
    for m in sampled:
        assert 0.0 <= m["eval/sampled/pass_at_1"] <= m["eval/sampled/pass_at_2"] <= 1.0
        assert (m["eval/sampled/n"], m["eval/sampled/temperature"]) == (3, 0.9)
