"""The update's optimizer: AdamW over the policy (and the critic's value head), its learning-rate schedule,
and ``Update``, the one wrapper the training loop steps through. Plain torch or DeepSpeed is chosen once, when
the trainer is built (``make_update``); the loop's code is the same for both."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

from trainer.config import Config


def make_scheduler(optimizer: torch.optim.Optimizer, config: Config) -> torch.optim.lr_scheduler.LambdaLR:
    """The policy's learning-rate schedule (``optim.schedule`` over ``steps``)."""
    return lr_schedule(optimizer, config.optim.warmup_steps, config.steps, config.optim.schedule)


def lr_schedule(optimizer: torch.optim.Optimizer, warmup: int, total: int, kind: str
                ) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up over ``warmup`` steps, then ``kind`` (constant, linear or cosine decay to 0 at ``total``)."""
    total = max(total, 1)

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        progress = min((step - warmup) / max(total - warmup, 1), 1.0)
        if kind == "linear":
            return 1.0 - progress
        if kind == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        return 1.0

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


class Update:
    """Gradients of a minibatch, accumulated over its micro-batches, then one optimizer step (plain torch)."""

    def __init__(self, optimizer: Any, grad_clip: float, micro_batch_size: int | None) -> None:
        self.optimizer = optimizer
        self.grad_clip = grad_clip
        self.micro_batch_size = micro_batch_size  # rows per backward; None: the whole minibatch

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self) -> float:
        """Clip (``optim.grad_clip``; 0 leaves gradients alone) and step; returns the gradient norm."""
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        clip = self.grad_clip if self.grad_clip > 0 else float("inf")
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, clip))
        self.optimizer.step()
        return grad_norm


class DeepSpeedUpdate(Update):
    """The same through a DeepSpeed engine: one backward per minibatch (its rows are DeepSpeed's micro-batch),
    clipped and zeroed by DeepSpeed itself."""

    def __init__(self, engine: Any, optimizer: Any) -> None:
        super().__init__(optimizer, grad_clip=0.0, micro_batch_size=None)
        self.engine = engine

    def zero_grad(self) -> None:
        pass  # DeepSpeed zeroes the gradients in its step

    def backward(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss)

    def step(self) -> float:
        self.engine.step()
        return float(self.engine.get_global_grad_norm() or 0.0)


def make_update(config: Config, model: torch.nn.Module, optimizer: torch.optim.Optimizer, out: Path) -> Update:
    """``DeepSpeedUpdate`` when ``config.deepspeed`` names a DeepSpeed config, else ``Update``."""
    if not config.deepspeed:
        return Update(optimizer, config.optim.grad_clip, config.micro_batch_size)
    from trainer.distributed import deepspeed_initialize, is_main_process, read_deepspeed_config

    # One backward per minibatch (its rows are DeepSpeed's micro-batch), clipped as optim.grad_clip says:
    # "auto" values of the DeepSpeed config take these, and the run directory keeps what was used.
    rows = config.rollout.prompts_per_step * config.rollout.group_size // config.algorithm.minibatches
    ds_config = read_deepspeed_config(
        config.deepspeed, micro_batch_size=max(rows, 1),
        gradient_clipping=config.optim.grad_clip if config.optim.grad_clip > 0 else None)
    if is_main_process():
        (out / "deepspeed.json").write_text(json.dumps(ds_config, indent=2) + "\n")
    engine, ds_optimizer = deepspeed_initialize(model, optimizer, ds_config)
    return DeepSpeedUpdate(engine, ds_optimizer)
