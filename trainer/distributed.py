"""Multi-process training helpers: DeepSpeed (ZeRO 1/2/3, bf16) and torch.distributed basics.

DeepSpeed is imported only inside the functions that use it, so a CPU install without the ``deepspeed`` extra
imports the trainer cleanly. Launch multi-GPU runs with the DeepSpeed launcher or torchrun; both set RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT::

    deepspeed --num_gpus 8 -m trainer.cli train CONFIG.yaml --set deepspeed=examples/deepspeed/zero3_bf16.json
    torchrun --nproc_per_node 8 -m trainer.cli train CONFIG.yaml --set deepspeed=examples/deepspeed/zero2_bf16.json

A plain ``python`` process gets a world of one (the variables are filled in, with a free port), which is how
DeepSpeed runs on the CPU with the gloo backend; NCCL is used when CUDA is there.

After a ZeRO-3 update every rank holds a slice of each parameter; ``full_state_dict`` gathers them for the
rollout engine's weight sync (``engine.update_weights``).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

# DeepSpeed keys whose value "auto" (the Hugging Face convention) the trainer fills in.
AUTO_KEYS = ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size",
             "gradient_clipping")


# ---------------------------------------------------------------------------------------------- process info
def die_with_launcher() -> None:
    """Under ``torchrun`` (which sets ``TORCHELASTIC_RUN_ID``), have the kernel SIGTERM this rank when its
    launcher dies. torchrun stops its ranks when it is itself stopped, but a SIGKILLed torchrun (the OOM
    killer, a killed job) cannot, and its ranks would train on unseen or wait in a collective forever,
    holding their devices. A no-op off Linux and outside torchrun (the ``deepspeed`` launcher's ranks are
    its ``pdsh``/local children and are left to it)."""
    import sys

    if "TORCHELASTIC_RUN_ID" not in os.environ or not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0)
    if os.getppid() == 1:  # the launcher died before the call: this rank was already handed to init
        raise SystemExit("torchrun exited before this rank started; nothing to train with")


def rank() -> int:
    """This process's global rank (0 without a launcher)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return int(os.environ.get("RANK", "0"))


def local_rank() -> int:
    """This process's rank on its machine: the GPU it drives."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def world_size() -> int:
    """How many processes train together (1 without a launcher)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_main_process() -> bool:
    """Only rank 0 writes checkpoints and events in a multi-process run."""
    return rank() == 0


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now ("" for every interface: a rendezvous other hosts connect to)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def default_backend() -> str:
    """NCCL on CUDA machines, gloo elsewhere (the CPU)."""
    return "nccl" if torch.cuda.is_available() else "gloo"


def init_process_group(backend: str | None = None) -> None:
    """Join (or, alone, form) the process group; a no-op when already initialised.

    A launcher (``deepspeed``, ``torchrun``) provides the rendezvous variables. A single process started with
    ``python`` has none, so it gets rank 0 of a world of one on a free local port; a launcher's partial
    setting (e.g. RANK without MASTER_ADDR) is an error, since guessing would hang the other ranks.
    """
    if not torch.distributed.is_available():
        raise RuntimeError("this torch build has no torch.distributed")
    if torch.distributed.is_initialized():
        return
    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    present = [n for n in names if n in os.environ]
    if not present or present == ["LOCAL_RANK"]:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(free_port()))
    elif missing := [n for n in names if n not in os.environ and n != "LOCAL_RANK"]:
        raise RuntimeError(
            f"torch.distributed: {', '.join(present)} set but {', '.join(missing)} missing; start the run with "
            f"`deepspeed` or `torchrun`, or set all of {', '.join(names)}"
        )
    os.environ.setdefault("LOCAL_RANK", os.environ["RANK"])
    backend = backend or default_backend()
    if backend == "nccl":
        torch.cuda.set_device(local_rank())
    torch.distributed.init_process_group(backend=backend)


def barrier() -> None:
    """Wait for every rank (a no-op in a single process)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()


def all_reduce_mean(value: float | torch.Tensor) -> float:
    """The mean of ``value`` over all ranks, for metrics each rank computed on its own share of the batch."""
    tensor = torch.as_tensor(value, dtype=torch.float64).reshape(())
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()) or world_size() == 1:
        return float(tensor)
    if torch.distributed.get_backend() == "nccl":
        tensor = tensor.cuda()
    torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.SUM)
    return float(tensor) / world_size()


def _active() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized() and world_size() > 1


def _all_reduce(tensor: torch.Tensor, op: Any, group: Any = None) -> torch.Tensor:
    if not _active():
        return tensor
    out = tensor.detach().clone()
    if group is None and torch.distributed.get_backend() == "nccl":  # a side group is gloo: CPU tensors
        out = out.cuda()
    torch.distributed.all_reduce(out, op=op, group=group)
    return out.to(tensor.device)


def all_reduce_sum(tensor: torch.Tensor, group: Any = None) -> torch.Tensor:
    """The element-wise sum of ``tensor`` over all ranks (the tensor itself in a single process).

    Sums and counts are what ranks reduce, never means: a mean of per-rank means weighs a rank with few
    tokens as much as one with many, and the N-rank loss would no longer be the one-process loss.
    group: a side process group (``side_group``) instead of the default one."""
    return _all_reduce(tensor, torch.distributed.ReduceOp.SUM, group)


def all_reduce_max(tensor: torch.Tensor, group: Any = None) -> torch.Tensor:
    """The element-wise maximum over all ranks (stage times: a step waits for its slowest rank)."""
    return _all_reduce(tensor, torch.distributed.ReduceOp.MAX, group)


def broadcast_module(module: torch.nn.Module, src: int = 0) -> None:
    """Every rank's parameters and buffers become rank ``src``'s, in place (a no-op in a single process).

    Once, when the plain-torch update is built across ranks: the ranks start from the same weights (PPO's
    value head is initialised from each rank's own random state), as DDP's wrap used to make them."""
    if not _active():
        return
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            torch.distributed.broadcast(tensor.detach(), src)


def average_gradients(params: Sequence[torch.Tensor], bucket_bytes: int = 64 << 20) -> None:
    """Replace each parameter's gradient by its mean over all ranks, in a few flat all-reduces (a no-op in a
    single process). Every rank must pass the same parameters in the same order.

    The parameters are packed into buckets (one dtype and device each, at most ``bucket_bytes`` of gradient)
    laid out from the parameters alone, so every rank makes the same calls whatever its gradients: a gradient
    that is None here goes in as zeros. Each bucket also carries one flag per parameter (1: it has a gradient
    here), so a parameter no rank computed a gradient for keeps None (the optimizer skips it, as one process
    would), and one that only some ranks reached gets their sum divided by the world size."""
    if not _active():
        return
    world = world_size()
    buckets: list[list[torch.Tensor]] = []
    sizes: list[int] = []
    filling: dict[tuple[torch.dtype, torch.device], int] = {}  # the bucket each dtype and device fills
    for p in params:
        size = p.numel() * p.element_size()
        i = filling.get((p.dtype, p.device))
        if i is None or sizes[i] + size > bucket_bytes:
            i = filling[(p.dtype, p.device)] = len(buckets)
            buckets.append([])
            sizes.append(0)
        buckets[i].append(p)
        sizes[i] += size
    for bucket in buckets:
        flags = torch.tensor([float(p.grad is not None) for p in bucket], dtype=bucket[0].dtype,
                             device=bucket[0].device)
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in bucket]
                         + [flags])
        torch.distributed.all_reduce(flat, op=torch.distributed.ReduceOp.SUM)
        flat /= world
        reached = flat[-len(bucket):].tolist()
        offset = 0
        for p, on in zip(bucket, reached, strict=True):
            mean = flat[offset:offset + p.numel()].view_as(p)
            offset += p.numel()
            if on <= 0:
                p.grad = None
            elif p.grad is None:
                p.grad = mean.clone()
            else:
                p.grad.copy_(mean)


def side_group() -> Any:
    """A second gloo process group over all ranks (None in a single process), for collectives issued from
    another thread (the asynchronous rollout producer's): on the default group they would interleave with
    the trainer's gradient all-reduce, which pairs collectives across ranks by issue order, and deadlock or
    mix up. Every rank must call it, at the same point (creating a group is itself a collective)."""
    if not _active():
        return None
    return torch.distributed.new_group(backend="gloo")


def all_gather_object(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order (``[obj]`` in a single process)."""
    if not _active():
        return [obj]
    out: list[Any] = [None] * world_size()
    torch.distributed.all_gather_object(out, obj)
    return out


def check_world(config: Any, world: int, *, colocated_hf: bool) -> None:
    """Refuse, before anything is built, a launch whose ranks could not compute the one-process step.

    ``config``: the trainer's ``Config``; ``colocated_hf``: the rollout engine shares the trainer's module."""
    from trainer.config import ConfigError

    prompts = config.rollout.prompts_per_step
    if prompts % world:
        raise ConfigError(
            f"rollout.prompts_per_step={prompts} is not divisible by the {world} ranks of this launch (a group of "
            f"rollouts never straddles ranks); set rollout.prompts_per_step to a multiple of {world}, or launch "
            f"a number of ranks that divides {prompts} (torchrun --nproc_per_node)")
    if world > 1 and colocated_hf and config.deepspeed and zero_stage(read_deepspeed_config(config.deepspeed)) == 3:
        raise ConfigError(
            f"deepspeed={config.deepspeed!r} is ZeRO-3, and engine=hf generates with the trainer's own module: "
            "ZeRO-3 re-partitions it after every forward, so ranks whose rollouts take different numbers of "
            "decode steps deadlock; use ZeRO-2 (examples/deepspeed/zero2_bf16.json) with engine=hf, or "
            "engine=vllm (its own copy of the weights, gathered after every update) with ZeRO-3")


def destroy_process_group() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


# ---------------------------------------------------------------------------------------------- DeepSpeed config
def read_deepspeed_config(
    config: str | os.PathLike[str] | Mapping[str, Any],
    *,
    micro_batch_size: int = 1,
    gradient_accumulation_steps: int = 1,
    gradient_clipping: float | None = None,
    client_optimizer: bool = True,
) -> dict[str, Any]:
    """Load a DeepSpeed JSON config (a path or a dict) and check it; errors name the key and the fix.

    ``"auto"`` values (as in Hugging Face's example configs) and missing batch sizes are filled from the
    trainer's settings. ``client_optimizer``: the trainer builds its own optimizer, so an ``optimizer``
    section would be a second one and is refused.
    """
    where = "deepspeed config"
    if isinstance(config, Mapping):
        cfg = json.loads(json.dumps(dict(config)))  # a deep copy that also proves it is plain JSON
    else:
        path = Path(config)
        where = f"deepspeed config {path}"
        try:
            cfg = json.loads(path.read_text())
        except FileNotFoundError:
            raise FileNotFoundError(f"deepspeed config {str(path)!r} does not exist") from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"{where}: the top level must be a JSON object, got {type(cfg).__name__}")

    zero = cfg.get("zero_optimization", {})
    if not isinstance(zero, dict):
        raise ValueError(f"{where}: zero_optimization must be an object like {{\"stage\": 2}}")
    stage = zero.get("stage", 0)
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"{where}: zero_optimization.stage must be 0, 1, 2 or 3, got {stage!r}")
    bf16 = bool(cfg.get("bf16", {}).get("enabled", False))
    fp16 = bool(cfg.get("fp16", {}).get("enabled", False))
    if bf16 and fp16:
        raise ValueError(f"{where}: bf16.enabled and fp16.enabled are both true; enable one of them")
    if bf16 and torch.cuda.is_available() and not torch.cuda.is_bf16_supported():
        raise ValueError(f"{where}: bf16.enabled but this GPU has no bf16; use fp16 instead")
    if client_optimizer and "optimizer" in cfg:
        raise ValueError(
            f"{where}: has an 'optimizer' section, but the trainer passes its own optimizer (optim.* settings); "
            f"remove the 'optimizer' section"
        )

    fills: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": gradient_accumulation_steps,
    }
    for key in AUTO_KEYS:
        if cfg.get(key) == "auto":
            if key == "gradient_clipping":
                if gradient_clipping is None:
                    del cfg[key]
                else:
                    cfg[key] = gradient_clipping
            elif key == "train_batch_size":
                del cfg[key]  # DeepSpeed derives it: micro batch x accumulation x world size
            else:
                cfg[key] = fills[key]
    for key, value in fills.items():
        cfg.setdefault(key, value)
    if gradient_clipping is not None:
        cfg.setdefault("gradient_clipping", gradient_clipping)
    for key in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps"):
        if not isinstance(cfg[key], int) or cfg[key] < 1:
            raise ValueError(f"{where}: {key} must be a positive integer or \"auto\", got {cfg[key]!r}")
    for section in ("bf16", "fp16", "zero_optimization"):
        for key, value in (cfg.get(section) or {}).items():
            if value == "auto":
                raise ValueError(f"{where}: {section}.{key} is \"auto\"; only batch sizes and gradient_clipping "
                                 f"are filled in by the trainer, so give {section}.{key} a value")
    return cfg


def zero_stage(config: Mapping[str, Any]) -> int:
    return int(config.get("zero_optimization", {}).get("stage", 0))


# ---------------------------------------------------------------------------------------------- DeepSpeed engine
def deepspeed_initialize(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    config: str | os.PathLike[str] | Mapping[str, Any],
    **config_fills: Any,
) -> tuple[Any, Any]:
    """Wrap ``model`` and ``optimizer`` in a DeepSpeed engine; returns ``(engine, optimizer)``.

    The trainer then calls ``engine(...)`` (or the model itself: DeepSpeed wraps it in place), then
    ``engine.backward(loss)`` and ``engine.step()``, which also steps and zeroes the optimizer and clips
    gradients when ``gradient_clipping`` is set. ``config_fills`` go to ``read_deepspeed_config``. With bf16 the
    model's parameters become bf16; with ZeRO-3 each rank keeps a slice of them (see ``full_state_dict``).
    """
    try:
        import deepspeed
    except ImportError as exc:
        raise RuntimeError("deepspeed=... needs DeepSpeed: pip install 'agentfly[deepspeed]'") from exc
    cfg = read_deepspeed_config(config, client_optimizer=optimizer is not None, **config_fills)
    init_process_group()
    if not deepspeed.comm.is_initialized():
        # DeepSpeed's comm layer adopts the torch.distributed group made above.
        deepspeed.init_distributed(dist_backend=torch.distributed.get_backend())
    if optimizer is None:
        engine, ds_optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                                          config=cfg)
    else:
        engine, ds_optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=cfg)
    return engine, ds_optimizer


@contextlib.contextmanager
def gathered_parameters(model: torch.nn.Module) -> Iterator[None]:
    """Inside the block every ZeRO-3 parameter of ``model`` is whole on every rank (a no-op otherwise).

    Every rank must enter it (it is a collective). It is for reading the weights (``full_state_dict``), not
    for generating with the module: ZeRO-3's forward hooks still run inside it and re-partition parameters
    after each forward, so ranks whose rollouts take different numbers of decode steps fall out of step.
    Multi-rank ZeRO-3 rollouts belong in an engine with its own copy of the weights (``VLLMEngine``).
    """
    params = [p for p in model.parameters() if hasattr(p, "ds_id")]
    if not params:
        yield
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
        yield


def full_state_dict(model: torch.nn.Module, *, dtype: torch.dtype | None = None,
                    device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """The model's whole parameters and buffers under Hugging Face names, for ``engine.update_weights``.

    ``model``: the trainer's module or its DeepSpeed engine. ZeRO-3 slices are gathered from all ranks (every
    rank must call this), and the copies are detached onto ``device``, in ``dtype`` when given (e.g. the
    rollout engine's float32 on the CPU while the trainer holds bf16).
    """
    module = getattr(model, "module", model)
    out: dict[str, torch.Tensor] = {}
    with gathered_parameters(module):
        for name, tensor in module.state_dict().items():
            t = tensor.detach().to(device)
            if dtype is not None and t.is_floating_point():
                t = t.to(dtype)
            out[name] = t.clone()
    return out
