"""Trajectories the infrastructure ended are never trained on: with real sandboxes killed from outside in
about one rollout of ten, the update's advantages and loss are those of the same batch without them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from trainer import algorithms
from trainer.config import load_config
from trainer.loop import InfrastructureStop, Trainer
from trainer.metrics import StageTimer, rollout_metrics

ROOT = Path(__file__).resolve().parents[3]
GROUP = 4


def _config(out: Path, *extra: str) -> Any:
    return load_config(ROOT / "examples/calculator/grpo.yaml", [
        f"model.path={ROOT / 'examples/calculator/warm_start'}", f"output_dir={out}", "steps=1", "threads=1",
        "update_threads=1", "progress=false", "max_minutes=null", "save_every=0", "rollout.prompts_per_step=10",
        f"rollout.group_size={GROUP}", "data.eval_size=4", "rollout.tools=[pooled_tools_for_tests:chaos_calculator]",
        "resources={python: {max: 4, acquire_timeout: 60}}", *extra,
    ])


@pytest.fixture
def advantages(monkeypatch: pytest.MonkeyPatch) -> list[torch.Tensor]:
    """Every advantage tensor the trainer computes, in order (the real function, recorded)."""
    seen: list[torch.Tensor] = []
    real = algorithms.compute_advantages

    def recorded(*args: Any, **kwargs: Any) -> Any:
        adv, returns = real(*args, **kwargs)
        seen.append(adv.detach().clone())
        return adv, returns

    monkeypatch.setattr(algorithms, "compute_advantages", recorded)
    return seen


def test_with_a_tenth_of_sandboxes_killed_mid_rollout_the_update_equals_the_one_without_the_failed_trajectories(
        tmp_path: Path, advantages: list[torch.Tensor]) -> None:
    trainer = Trainer(_config(tmp_path / "a"))
    try:
        collected = trainer.collect(StageTimer())
    finally:
        trainer.agent.close()
    everything = collected.everything
    failed = [t for t in everything if t.failure]
    assert 1 <= len(failed) <= len(everything) // 4
    assert all(t.failure == "killed" and "killed from outside" in (t.failure_reason or "") for t in failed)
    assert not any(t.failure for t in collected.trajectories)  # never trained on
    metrics = rollout_metrics(everything)
    assert metrics["rollout/infra_failed"] == metrics["rollout/infra_failure/killed"] == len(failed)
    healthy = [t for t in everything if not t.failure]
    assert metrics["reward/mean"] == pytest.approx(sum(t.reward for t in healthy) / len(healthy))

    trainer.model.eval()  # as train_step does: dropout off
    trained = trainer._update(collected.trajectories, collected.rewards, collected.groups, StageTimer())

    # The reference: a fresh trainer (same weights, same seed) updated on the batch with the failed
    # trajectories taken out by hand, each healthy one in the group of its prompt.
    reference = Trainer(_config(tmp_path / "b"))
    reference.agent.close()
    reference.model.eval()
    kept = [(i, t) for i, t in enumerate(everything) if not t.failure]
    expected = reference._update([t for _, t in kept], [t.reward for _, t in kept], [i // GROUP for i, _ in kept],
                                 StageTimer())
    torch.testing.assert_close(advantages[0], advantages[1])
    losses = [k for k in trained if k.startswith(("loss", "update/loss", "actor/"))]
    assert losses
    for key in losses:
        assert trained[key] == pytest.approx(expected[key], rel=1e-6, abs=1e-9), key


def test_drop_group_leaves_out_every_group_that_met_an_infrastructure_failure(tmp_path: Path) -> None:
    trainer = Trainer(_config(tmp_path, "rollout.infra_failures=drop_group", "algorithm.max_sample_batches=1"))
    try:
        collected = trainer.collect(StageTimer())
    finally:
        trainer.agent.close()
    broken = {i // GROUP for i, t in enumerate(collected.everything) if t.failure}
    assert broken
    assert not set(collected.groups) & broken
    assert all(collected.groups.count(g) == GROUP for g in set(collected.groups))  # whole groups only


def test_a_job_whose_every_rollout_fails_in_the_infrastructure_stops_naming_the_failure(tmp_path: Path) -> None:
    # Steps that train nothing are not a success: after rollout.max_infra_failed_steps of them in a row the job
    # stops with the failure's kind and reason, its metrics recorded up to there.
    config = _config(tmp_path / "c", "steps=6", "rollout.prompts_per_step=2", "rollout.group_size=2",
                     "rollout.tools=[agentfly.tools.builtin.calculator:calculator]",
                     "rollout.reward=pooled_tools_for_tests:judge_down", "rollout.max_infra_failed_steps=2",
                     "resources={}")
    trainer = Trainer(config)
    try:
        with pytest.raises(InfrastructureStop) as stopped:
            trainer.train()
    finally:
        trainer.agent.close()
    assert "last 2 steps" in str(stopped.value)
    assert "server_down: the judge at 127.0.0.1:9 stopped answering" in str(stopped.value)
    assert trainer.step == 2
