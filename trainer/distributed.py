"""Multi-process training helpers: DeepSpeed (ZeRO 1/2/3, bf16) and torch.distributed basics.

DeepSpeed is imported only inside ``deepspeed_initialize``, so a CPU install without the ``deepspeed`` extra
imports the trainer cleanly. Launch multi-GPU runs with the DeepSpeed launcher or torchrun::

    deepspeed --num_gpus 8 -m trainer.cli train CONFIG.yaml --set deepspeed=ds_config.json
    torchrun --nproc_per_node 8 -m trainer.cli train CONFIG.yaml --set deepspeed=ds_config.json
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_main_process() -> bool:
    """Only rank 0 writes checkpoints and events in a multi-process run."""
    return rank() == 0


def read_deepspeed_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load and check a DeepSpeed JSON config; errors name the key to fix."""
    path = Path(path)
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"deepspeed config {str(path)!r} does not exist") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"deepspeed config {path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    stage = config.get("zero_optimization", {}).get("stage", 0)
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"deepspeed config {path}: zero_optimization.stage must be 0, 1, 2 or 3, got {stage!r}")
    # The trainer owns the optimizer and the loop's batch size; fill what DeepSpeed insists on.
    config.setdefault("train_micro_batch_size_per_gpu", 1)
    config.setdefault("gradient_accumulation_steps", 1)
    return config


def deepspeed_initialize(model: torch.nn.Module, optimizer: torch.optim.Optimizer, config_path: str
                         ) -> tuple[Any, Any]:
    """Wrap ``model`` and ``optimizer`` in a DeepSpeed engine; returns ``(engine, optimizer)``.

    Uses the NCCL backend on GPUs and gloo on CPUs; a single process without a launcher gets a world of one.
    """
    try:
        import deepspeed
    except ImportError as exc:
        raise RuntimeError("deepspeed=... needs DeepSpeed: pip install 'agentfly[deepspeed]'") from exc
    config = read_deepspeed_config(config_path)
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29511")
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    deepspeed.init_distributed(dist_backend=backend)
    engine, ds_optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    return engine, ds_optimizer
