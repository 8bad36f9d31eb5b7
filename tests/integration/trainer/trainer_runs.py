"""Settings for trainer runs small enough for CI (imported by the trainer's integration tests)."""

from __future__ import annotations

from pathlib import Path


def tiny_overrides(model_dir: Path, out: Path, *extra: str) -> list[str]:
    """A run small enough for CI: 2 prompts x 2 samples, short turns, 4 eval problems."""
    return [
        f"model.path={model_dir}", f"output_dir={out}", "steps=2", "threads=1", "progress=false",
        "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=8", "rollout.max_turns=2",
        "data.train_size=64", "data.eval_size=4", "eval.max_new_tokens=8", "log_samples=1", *extra,
    ]
