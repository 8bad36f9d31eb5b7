"""Checkpoints: the model as safetensors via ``save_pretrained`` (loadable by anything that reads Hugging
Face checkpoints, including ``agentfly eval``), plus ``trainer_state.pt`` with everything else a resume needs
to continue exactly where it stopped: optimizer, scheduler, the RNG states (torch, Python, numpy), the data
position, the step and the best eval score so far.

Layout under the run directory::

    checkpoint-000040/   model.safetensors, config.json, tokenizer files, trainer_state.pt, config.yaml
    checkpoint-latest -> checkpoint-000040      (symlink)
    checkpoint-best   -> checkpoint-000020      (symlink; best eval accuracy)

Only the last ``keep_last`` checkpoints and the best one are kept.

A data-parallel run adds what is each rank's own: ``rank-00001.pt`` (RNG states) for every rank, and under
DeepSpeed ``deepspeed/`` (DeepSpeed's checkpoint: each rank's ZeRO optimizer slice, module states); rank 0
writes the rest, so the Hugging Face weights are whole whatever the ZeRO stage.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

STATE_FILE = "trainer_state.pt"


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _point(link: Path, target: Path) -> None:
    tmp = link.with_name(link.name + ".tmp")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    tmp.symlink_to(target.name)
    os.replace(tmp, link)  # atomic: a reader never sees a missing link


def save_checkpoint(
    run_dir: str | os.PathLike[str],
    step: int,
    *,
    model: Any,
    tokenizer: Any,
    state: dict[str, Any],
    extra_modules: dict[str, torch.nn.Module] | None = None,
    score: float | None = None,
    keep_last: int = 2,
    weights: dict[str, torch.Tensor] | None = None,
    started: bool = False,
) -> Path:
    """Write ``checkpoint-{step}``, move ``checkpoint-latest`` (and ``checkpoint-best`` when ``score`` is the
    best so far) and prune old ones. ``state`` holds optimizer/scheduler/data state; RNG states are added.

    ``weights``: the full state dict to write (gathered from ZeRO-3 slices) instead of the module's own.
    ``started``: ``partial_path`` was already made and holds the other ranks' files (kept, not wiped)."""
    run_dir = Path(run_dir)
    path = run_dir / f"checkpoint-{step:06d}"
    tmp = partial_path(run_dir, step)
    if not started:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
    model.save_pretrained(tmp, safe_serialization=True, **({"state_dict": weights} if weights is not None else {}))
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp)
    full = dict(state, step=step, rng=rng_state(), score=score)
    full["extra_modules"] = {k: m.state_dict() for k, m in (extra_modules or {}).items()}
    torch.save(full, tmp / STATE_FILE)
    if path.exists():
        shutil.rmtree(path)
    os.replace(tmp, path)  # a checkpoint directory is complete or absent
    _point(run_dir / "checkpoint-latest", path)
    best_file = run_dir / "best.json"
    best = json.loads(best_file.read_text()) if best_file.exists() else None
    if score is not None and (best is None or score > best["score"]):
        best_file.write_text(json.dumps({"step": step, "score": score, "path": path.name}))
        _point(run_dir / "checkpoint-best", path)
    _prune(run_dir, keep_last)
    return path


def partial_path(run_dir: str | os.PathLike[str], step: int) -> Path:
    """Where ``checkpoint-{step}`` is written before it is complete (then renamed in one move)."""
    return Path(run_dir) / f".checkpoint-{step:06d}.partial"


def _prune(run_dir: Path, keep_last: int) -> None:
    best_file = run_dir / "best.json"
    best = json.loads(best_file.read_text())["path"] if best_file.exists() else None
    checkpoints = sorted(p for p in run_dir.glob("checkpoint-[0-9]*") if p.is_dir())
    for old in checkpoints[: max(len(checkpoints) - max(keep_last, 1), 0)]:
        if old.name != best:
            shutil.rmtree(old)


def resolve(path: str | os.PathLike[str]) -> Path:
    """A checkpoint directory, or a run directory (whose ``checkpoint-latest`` is taken)."""
    path = Path(path)
    if (path / STATE_FILE).exists() or (path / "config.json").exists():
        return path.resolve()
    if (path / "checkpoint-latest").exists():
        return (path / "checkpoint-latest").resolve()
    raise FileNotFoundError(f"{str(path)!r} is neither a checkpoint (no {STATE_FILE} or config.json) nor a run "
                            "directory with a checkpoint-latest; pass e.g. runs/calculator/checkpoint-latest")


def load_state(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``trainer_state.pt`` of a checkpoint (optimizer, scheduler, RNG, data position, step)."""
    file = resolve(path) / STATE_FILE
    if not file.exists():
        raise FileNotFoundError(f"{file} is missing: this is a model directory, not a resumable training checkpoint")
    state: dict[str, Any] = torch.load(file, map_location="cpu", weights_only=False)
    return state
