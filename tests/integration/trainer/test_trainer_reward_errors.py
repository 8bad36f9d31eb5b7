"""A reward that raises is never a silent 0: its errors are counted per step, its first traceback is logged,
and a job whose every reward raises for ``rollout.max_reward_error_steps`` steps (or in an evaluation) fails
with the reward's traceback and the fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from trainer.config import load_config
from trainer.events import CallbackSink, Event
from trainer.loop import RewardErrorStop, Trainer

ROOT = Path(__file__).resolve().parents[3]


def _config(out: Path, *extra: str) -> Any:
    return load_config(ROOT / "examples/calculator/grpo.yaml", [
        f"model.path={ROOT / 'examples/calculator/warm_start'}", f"output_dir={out}", "steps=6", "threads=1",
        "update_threads=1", "progress=false", "max_minutes=null", "save_every=0", "rollout.prompts_per_step=2",
        "rollout.group_size=2", "data.eval_size=2", "rollout.max_turns=2", "resources={}", *extra,
    ])


def test_a_job_whose_reward_raises_on_every_call_fails_with_its_traceback_after_the_set_steps(tmp_path: Path) -> None:
    events: list[Event] = []
    config = _config(tmp_path / "c", "rollout.reward=pooled_tools_for_tests:lookup_reward",
                     "rollout.max_reward_error_steps=2")
    trainer = Trainer(config, sinks=[CallbackSink(events.append)])
    with pytest.raises(RewardErrorStop) as stopped:
        trainer.train()
    message = str(stopped.value)
    assert trainer.step == 2
    assert "every rollout of the last 2 steps" in message
    assert "reward 'lookup_reward' raised KeyError: 'start'" in message
    assert 'in lookup_reward' in message and "Traceback" in message  # where to look
    assert "rollout.max_reward_error_steps" in message and "Fix the reward" in message
    metrics = [e["data"] for e in events if e["type"] == "metrics" and "reward_errors/fraction" in e["data"]]
    assert [m["reward_errors/fraction"] for m in metrics] == [1.0, 1.0]
    assert [m["reward_errors/count"] for m in metrics] == [4.0, 4.0]
    warnings = [e["data"] for e in events if e["type"] == "log" and e["data"]["level"] == "warning"]
    assert len(warnings) == 1 and "raised on 100% of the rollouts of step 1" in warnings[0]["message"]
    assert "KeyError" in warnings[0]["traceback"]
    failed = [e["data"] for e in events if e["type"] == "status" and e["data"]["state"] == "failed"]
    assert failed and "KeyError: 'start'" in failed[0]["message"]


def test_an_evaluation_whose_every_reward_raises_fails_the_job_at_once(tmp_path: Path) -> None:
    # One training step is under the limit of 5; the final evaluation's rewards all raise: it fails there,
    # rather than report an accuracy of 0 as if the model had learnt nothing.
    config = _config(tmp_path / "c", "steps=1", "rollout.reward=pooled_tools_for_tests:lookup_reward",
                     "rollout.max_reward_error_steps=5")
    trainer = Trainer(config)
    with pytest.raises(RewardErrorStop) as stopped:
        trainer.train()
    assert trainer.step == 1
    assert "every rollout of the evaluation at step 1" in str(stopped.value)
    assert "KeyError: 'start'" in str(stopped.value)


def test_a_reward_that_raises_on_some_rollouts_is_counted_and_the_job_goes_on(tmp_path: Path) -> None:
    events: list[Event] = []
    config = _config(tmp_path / "c", "steps=2", "rollout.reward=pooled_tools_for_tests:flaky_reward",
                     "rollout.max_reward_error_steps=1")
    result = Trainer(config, sinks=[CallbackSink(events.append)]).train()
    assert result["state"] == "succeeded"
    shares = [e["data"]["reward_errors/fraction"] for e in events
              if e["type"] == "metrics" and "reward_errors/fraction" in e["data"]]
    assert shares == [0.5, 0.5]  # every other call raised: counted, and the job trained on
