"""The update's optimizer: AdamW over the policy (and the critic's value head), its learning-rate schedule,
and ``Update``, the one wrapper the training loop steps through. Plain torch or DeepSpeed is chosen once, when
the trainer is built (``make_update``); the loop's code is the same for both."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

from trainer import distributed as dist
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


class Actor(torch.nn.Module):
    """The policy and, for PPO, its value head as one module: the ranks average and DeepSpeed shards, saves
    and restores both together (the critic trains inside the same engine as the policy). ``forward`` is the
    policy's (Hugging Face keyword arguments); the value head is called on its hidden states."""

    def __init__(self, policy: torch.nn.Module, value_head: torch.nn.Module | None = None) -> None:
        super().__init__()
        self.policy = policy
        self.value_head = value_head

    def forward(self, **kwargs: Any) -> Any:
        return self.policy(**kwargs)


class Update:
    """Gradients of a minibatch, accumulated over its micro-batches, then one optimizer step (plain torch).

    ``module`` is what the update's forward passes go through (the ``Actor``, or its DeepSpeed engine)."""

    def __init__(self, module: torch.nn.Module, optimizer: Any, grad_clip: float, micro_batch_size: int | None
                 ) -> None:
        self.module = module
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


class DataParallelUpdate(Update):
    """Plain torch across ranks: each rank accumulates its micro-batches' gradients alone, then the ranks
    average them in a few flat all-reduces per optimizer step, before clipping (so clipping and ``grad_norm``
    see the averaged gradient, as they would in one process). The ranks start from rank 0's weights.

    Why not ``DistributedDataParallel``: it broadcasts buffers in every forward call (a collective), so every
    rank would have to make the same number of forward calls, while the update's forward takes as many passes
    as a rank's own rows need (group prompts, length buckets: ``trainer.batch.forward``), which halves a
    rank's update time. Here nothing in forward or backward is a collective: ranks may make any number of
    passes and micro-batches and still meet in the same all-reduces, one set per optimizer step. What is
    given up is DDP's overlap of the reduction with the backward, and under ``no_sync`` (all micro-batches
    but the last) DDP overlapped it with the last micro-batch's backward only."""

    def __init__(self, module: torch.nn.Module, optimizer: Any, grad_clip: float, micro_batch_size: int | None
                 ) -> None:
        super().__init__(module, optimizer, grad_clip, micro_batch_size)
        dist.broadcast_module(module)

    def step(self) -> float:
        dist.average_gradients([p for g in self.optimizer.param_groups for p in g["params"]])
        return super().step()


class DeepSpeedUpdate(Update):
    """The same through a DeepSpeed engine: one backward per minibatch (its rows are DeepSpeed's micro-batch),
    clipped and zeroed by DeepSpeed itself."""

    def __init__(self, engine: Any, optimizer: Any) -> None:
        super().__init__(engine, optimizer, grad_clip=0.0, micro_batch_size=None)
        self.engine = engine

    def zero_grad(self) -> None:
        pass  # DeepSpeed zeroes the gradients in its step

    def backward(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss)

    def step(self) -> float:
        self.engine.step()
        return float(self.engine.get_global_grad_norm() or 0.0)


def make_update(config: Config, actor: Actor, optimizer: torch.optim.Optimizer, out: Path, world: int = 1
                ) -> Update:
    """``DeepSpeedUpdate`` when ``config.deepspeed`` names a DeepSpeed config, else ``DataParallelUpdate``
    across ranks (``world`` > 1), else ``Update``."""
    if not config.deepspeed:
        if world > 1:
            return DataParallelUpdate(actor, optimizer, config.optim.grad_clip, config.micro_batch_size)
        return Update(actor, optimizer, config.optim.grad_clip, config.micro_batch_size)
    # One backward per minibatch (its rows are DeepSpeed's micro-batch), clipped as optim.grad_clip says:
    # "auto" values of the DeepSpeed config take these, and the run directory keeps what was used.
    rows = config.rollout.prompts_per_step * config.rollout.group_size // config.algorithm.minibatches // world
    ds_config = dist.read_deepspeed_config(
        config.deepspeed, micro_batch_size=max(rows, 1),
        gradient_clipping=config.optim.grad_clip if config.optim.grad_clip > 0 else None)
    if dist.is_main_process():
        (out / "deepspeed.json").write_text(json.dumps(ds_config, indent=2) + "\n")
    engine, ds_optimizer = dist.deepspeed_initialize(actor, optimizer, ds_config)
    return DeepSpeedUpdate(engine, ds_optimizer)
