"""Fixtures for the trainer's integration tests: the real tiny model, built once per session."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from agentfly.models import build_tiny

    return build_tiny(tmp_path_factory.mktemp("trainer-tiny"), seed=0)


def tiny_overrides(model_dir: Path, out: Path, *extra: str) -> list[str]:
    """A run small enough for CI: 2 prompts x 2 samples, short turns, 4 eval problems."""
    return [
        f"model.path={model_dir}", f"output_dir={out}", "steps=2", "threads=1", "progress=false",
        "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=8", "rollout.max_turns=2",
        "data.train_size=64", "data.eval_size=4", "eval.max_new_tokens=8", "log_samples=1", *extra,
    ]
