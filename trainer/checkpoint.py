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

``save_run`` and ``resume_run`` are a training run's side of it: what the trainer's ``Learner`` (policy, value
head, optimizer, schedule; ``trainer.update``) writes into a checkpoint, and reads back on resume.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from trainer import distributed as dist
from trainer.config import ConfigError, save_config
from trainer.optim import DeepSpeedUpdate

if TYPE_CHECKING:
    from trainer.events import EventStream
    from trainer.update import Learner

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


# ------------------------------------------------------------------------------------------ a run's save and resume


def save_run(learner: Learner, *, step: int, tokenizer: Any, data: dict[str, int], producer: dict[str, Any] | None,
             best: float | None, score: float | None, events: EventStream) -> Path:
    """A run's checkpoint at ``step``; every rank calls it (it is a collective). Each rank writes its RNG
    states, and under DeepSpeed its share of DeepSpeed's checkpoint; rank 0 writes the whole weights, the
    optimizer and schedule, the data position (``data``, the cursor after the last trained batch) and what
    the async ``producer`` had sampled ahead, then emits the ``checkpoint`` event."""
    config, rank = learner.config, dist.rank()
    out = Path(config.output_dir)
    tmp = partial_path(out, step)
    if rank == 0:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
    dist.barrier()
    torch.save({"rng": rng_state()}, tmp / f"rank-{rank:05d}.pt")
    deepspeed = isinstance(learner.update, DeepSpeedUpdate)
    if isinstance(learner.update, DeepSpeedUpdate):
        learner.update.engine.save_checkpoint(str(tmp / "deepspeed"), tag="state")
    weights = dist.full_state_dict(learner.model) if learner.zero3 else None  # gathered on every rank
    path = out / f"checkpoint-{step:06d}"
    if rank == 0:
        state = {"scheduler": learner.scheduler.state_dict(), "data": data, "best": best, "world_size": learner.world}
        if producer is not None:
            state["producer"] = producer
        if not deepspeed:  # replicated on every rank, so rank 0's is everyone's
            state["optimizer"] = learner.optimizer.state_dict()
        extra: dict[str, torch.nn.Module] | None = (
            {"value_head": learner.value_head} if learner.value_head is not None and not deepspeed else None)
        path = save_checkpoint(out, step, model=learner.model, tokenizer=tokenizer, state=state, extra_modules=extra,
                               score=score, keep_last=config.keep_last, weights=weights, started=True)
        save_config(config, path / "config.yaml")
        events.checkpoint(step, path, score)
    dist.barrier()
    return path


def check_resume_world(path: str | os.PathLike[str], world: int, deepspeed: bool) -> None:
    """Refuse, before anything is loaded, a DeepSpeed resume on another number of ranks than saved it."""
    saved = int(load_state(path).get("world_size", 1))
    if saved != world and deepspeed:
        raise ConfigError(
            f"checkpoint {path} was saved by {saved} DeepSpeed ranks and this launch has {world}: each "
            f"rank's ZeRO optimizer slice cannot be resharded here; resume with {saved} ranks (torchrun "
            f"--nproc_per_node {saved}), or start a new run from its weights (--set model.path={path})")


def resume_run(learner: Learner, path: str | os.PathLike[str]) -> tuple[Path, dict[str, Any]]:
    """Load a checkpoint's weights, optimizer state, schedule and this rank's RNG states into ``learner``;
    returns the checkpoint directory and its state (data position, step, best score) for the trainer."""
    ckpt = resolve(path)
    state = load_state(ckpt)
    if isinstance(learner.update, DeepSpeedUpdate):
        if not (ckpt / "deepspeed").is_dir():
            raise ConfigError(f"checkpoint {ckpt} has no DeepSpeed state (it was saved without deepspeed=); "
                              f"resume it without deepspeed=, or start a new run from its weights "
                              f"(--set model.path={ckpt})")
        # DeepSpeed's own checkpoint: module (policy and value head) and this rank's optimizer slice.
        learner.update.engine.load_checkpoint(str(ckpt / "deepspeed"), tag="state", load_optimizer_states=True,
                                              load_lr_scheduler_states=False)
    else:
        _load_weights(learner, ckpt)
        learner.optimizer.load_state_dict(state["optimizer"])
        if learner.value_head is not None and "value_head" in state.get("extra_modules", {}):
            learner.value_head.load_state_dict(state["extra_modules"]["value_head"])
    learner.scheduler.load_state_dict(state["scheduler"])
    # This rank's RNG states; a plain-torch run resumed on more ranks than it was saved with (its optimizer
    # state is the same on every rank, so it reshards freely) starts the new ranks from rank 0's.
    mine = ckpt / f"rank-{dist.rank():05d}.pt"
    set_rng_state(torch.load(mine, weights_only=False)["rng"] if mine.is_file() else state["rng"])
    return ckpt, state


def _load_weights(learner: Learner, ckpt: Path) -> None:
    from safetensors.torch import load_file

    model_path = learner.config.model.path
    if (ckpt / "adapter_model.safetensors").is_file():  # LoRA: the checkpoint holds the adapters only
        from peft import set_peft_model_state_dict

        result: Any = set_peft_model_state_dict(learner.model, load_file(ckpt / "adapter_model.safetensors"))
        if result.unexpected_keys:
            raise ValueError(f"checkpoint {ckpt}: adapters do not fit this model ({result.unexpected_keys[:3]})")
        missing, unexpected = [], []
    else:
        weights = load_file(ckpt / "model.safetensors", device=str(learner.device))
        missing, unexpected = learner.model.load_state_dict(weights, strict=False)
    # Tied embeddings are saved once; anything else missing means the checkpoint is of another model.
    missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise ValueError(f"checkpoint {ckpt} does not match model.path={model_path!r}: "
                         f"missing {missing[:3]}, unexpected {unexpected[:3]}")
