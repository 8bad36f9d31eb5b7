"""On a CUDA device, the trainer's GPU path (the policy and its rollouts on the device, the update in mixed
precision where the device has it) trains the tiny model: a step's loss and gradient norm are finite, and the
weights stay finite on the device. Skipped
where there is no GPU; ``benchmarks/gpu.py`` measures the same paths' throughput on one."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from trainer.config import load_config
from trainer.events import CallbackSink
from trainer.loop import Trainer

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none on this machine)")]


def test_a_grpo_step_on_the_gpu_gives_a_finite_loss_and_moves_the_weights(
        tiny_model_dir: Path, tmp_path: Path, tiny_overrides: Callable[..., list[str]]) -> None:
    events: list[dict[str, Any]] = []
    trainer = Trainer(load_config(None, tiny_overrides(tiny_model_dir, tmp_path, "device=cuda", "steps=1",
                                                       "save_every=0")), sinks=[CallbackSink(events.append)])
    assert next(trainer.learner.model.parameters()).is_cuda
    trainer.train()
    step = next(e["data"] for e in events if e["type"] == "metrics" and "loss/policy" in e["data"])
    assert math.isfinite(step["loss/policy"]) and math.isfinite(step["grad_norm"])
    assert all(p.is_cuda and torch.isfinite(p).all() for p in trainer.learner.model.parameters())
