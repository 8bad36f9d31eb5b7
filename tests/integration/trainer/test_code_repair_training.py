"""A code-repair job from its example YAML trains on the tiny model: each group's rollouts hold forks of one
workspace prepared for their project, the reward runs the project's tests there, and the samples carry the
diff and the test report for the rollout viewer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from trainer.config import load_config
from trainer.events import CallbackSink
from trainer.loop import Trainer

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.slow
def test_a_code_repair_job_from_yaml_trains_two_steps_with_one_prepared_workspace_per_group(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    config = load_config(ROOT / "examples/code_repair/grpo.yaml", [
        f"model.path={tiny_model_dir}", f"output_dir={tmp_path}", "steps=2", "threads=1", "update_threads=1",
        "progress=false", "max_minutes=null", "save_every=0", "data.train_size=16", "data.eval_size=2",
        "rollout.prompts_per_step=2", "rollout.group_size=3", "rollout.max_new_tokens=24", "rollout.max_turns=2",
        "eval.every=0", "eval.max_new_tokens=16", "log_samples=-1",
    ])
    events: list[dict[str, Any]] = []
    Trainer(config, sinks=[CallbackSink(events.append)]).train()
    steps = [e["data"] for e in events if e["type"] == "metrics" and "time/step" in e["data"]]
    assert len(steps) == 2 and all(torch.isfinite(torch.tensor(s["loss/total"])) for s in steps)
    trajectories = [t for e in events if e["type"] == "samples" for t in e["data"]["trajectories"]]
    assert len(trajectories) == 12 and all(t["failure"] is None for t in trajectories)
    # Every rollout held a fork of its group's workspace, so its project's tests ran there: the untouched
    # project's pass share, with pytest's report attached.
    for t in trajectories:
        assert t["reward"] == pytest.approx(t["sample"]["baseline"]) and "passed" in t["artifacts"]["tests"]
    pools = [e["data"]["pools"]["workspace"] for e in events if e["type"] == "resources"
             and "workspace" in e["data"]["pools"]]
    assert pools and pools[-1]["acquires"] == 4 and pools[-1]["in_use"] == 0  # 2 groups a step, not 6 rollouts
