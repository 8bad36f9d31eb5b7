"""Turn-level credit in a real training step: the long key chain with a per-hop turn reward from the store, on
the key-chain warm start. Every sampled token of turn t gets turn t's advantage and nothing else does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from trainer import algorithms
from trainer.config import load_config
from trainer.events import CallbackSink
from trainer.loop import Trainer

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.slow
@pytest.mark.parametrize(("algorithm", "credit"), [("grpo", "turn"), ("grpo", "step"), ("ppo", "turn_gae")])
def test_a_turn_credited_step_gives_each_turns_tokens_one_advantage_and_trains(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, algorithm: str, credit: str) -> None:
    seen: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
    real = algorithms.compute_turn_advantages

    def recorded(*args: Any, **kwargs: Any) -> Any:
        adv, returns = real(*args, **kwargs)
        turn_of, mask = args[3], args[4]
        seen.append((adv.detach().clone(), turn_of.clone(), mask.clone()))
        return adv, returns

    monkeypatch.setattr(algorithms, "compute_turn_advantages", recorded)
    config = load_config(ROOT / "examples/key_chain/grpo.yaml", [
        f"model.path={ROOT / 'examples/key_chain/warm_start'}", f"output_dir={tmp_path}", "steps=2", "threads=1",
        "update_threads=1", "progress=false", "max_minutes=null", "save_every=0", "data.task=key_chain_long",
        "data.train_size=64", "data.eval_size=4", "rollout.prompts_per_step=4", "rollout.group_size=4",
        "rollout.max_turns=11", "rollout.tools=[agentfly.tools.builtin.lookup:lookup_rewarded]",
        f"algorithm.name={algorithm}", f"algorithm.credit={credit}", "log_samples=-1",
    ])
    events: list[dict[str, Any]] = []
    Trainer(config, sinks=[CallbackSink(events.append)]).train()
    steps = [e["data"] for e in events if e["type"] == "metrics" and "time/step" in e["data"]]
    assert len(steps) == 2 and all(torch.isfinite(torch.tensor(s["loss/total"])) for s in steps)
    # The store credited the hops the warm start followed, and the samples carry those turn rewards.
    trajectories = [t for e in events if e["type"] == "samples" for t in e["data"]["trajectories"]]
    assert any(r["value"] == pytest.approx(0.1) and r["reason"].startswith("followed k")
               for t in trajectories for r in t["turn_rewards"])
    assert len(seen) == 2
    for adv, turn_of, mask in seen:
        width = min(adv.shape[1], turn_of.shape[1])
        adv, turn_of, mask = adv[:, :width], turn_of[:, :width], mask[:, :width]
        assert torch.all(adv[mask == 0] == 0)
        for row in range(adv.shape[0]):
            for k in turn_of[row].unique().tolist():
                if k >= 0:
                    values = adv[row][turn_of[row] == k]
                    assert torch.allclose(values, values[0].expand_as(values)), (row, k)
    assert any(adv.abs().sum() > 0 for adv, _, _ in seen)
