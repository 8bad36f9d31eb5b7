"""The training loop: one step is a sequence of named, timed stages (after verl's ``ray_trainer``)::

    rollout      sample `group_size` trajectories per prompt through ``agentfly.Agent`` (rewards are scored
                 by the rollout layer as each trajectory ends)
    reward       collect rewards, overlong shaping, DAPO dynamic sampling (drop and refill flat groups)
    logprobs     pad the batch; old logprobs (the engine's, or recomputed), reference logprobs, values
    advantages   the algorithm's estimator over mask-1 tokens (``trainer.algorithms``)
    update       epochs x minibatches of the masked clipped loss, gradient clipping, optimizer + scheduler
    weight_sync  the engine gets the new weights (in place for HF: it shares the module)
    eval         greedy held-out accuracy (every `eval.every` steps and at the end)
    checkpoint   safetensors + optimizer/scheduler/RNG/data position (every `save_every` steps and at the end)

Each stage's seconds are reported as ``time/<stage>`` in the step's metrics event.

    python -m trainer.cli train examples/calculator/grpo.yaml
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import json
import math
import os
import random
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from trainer import algorithms as algos
from trainer.checkpoint import load_state, save_checkpoint, set_rng_state
from trainer.config import Config, save_config
from trainer.events import EventStream, JSONLSink, RunState, Sink, TensorBoardSink

if TYPE_CHECKING:
    from agentfly.agents.agent import Agent
    from agentfly.engines.base import Engine
    from agentfly.resources import ResourceEngine
    from agentfly.rollout.trajectory import Trajectory

# ------------------------------------------------------------------------------------------ setup helpers


def setup_torch(config: Config) -> torch.device:
    """Seed everything and size the thread pool: all cores but one (the event loop, tool subprocesses and
    reward functions need a core; on a shared 2-core box two spinning OpenMP threads ran 10x slower than one)."""
    threads = config.threads or max(1, (os.cpu_count() or 2) - 1)
    torch.set_num_threads(threads)
    seed_everything(config.seed)
    if config.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(config.device)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def import_object(spec: str, what: str) -> Any:
    """``"package.module:attribute"`` -> the attribute; errors say which config key to fix."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not attr:
        raise ValueError(f"{what} {spec!r} must be written 'module:attribute', e.g. "
                         "'agentfly.tools.builtin.calculator:calculator'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"{what} {spec!r}: cannot import {module_name!r} ({exc})") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ValueError(f"{what} {spec!r}: module {module_name!r} has no attribute {attr!r}") from None


def load_policy(config: Config, device: torch.device, path: str | None = None) -> tuple[Any, Any]:
    """The policy module and tokenizer from ``model.path`` (building the tiny model there if asked to)."""
    import dataclasses

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentfly.models.tiny import STAMP, build_tiny

    path = path or config.model.path
    if (Path(path) / "adapter_config.json").is_file():
        return _load_lora_checkpoint(Path(path), config, device)
    if not Path(path).is_dir() and not config.model.build_tiny:
        raise FileNotFoundError(f"model.path {path!r} does not exist; point it at a local model directory "
                                "or set model.build_tiny=true to build the tiny CPU model there")
    if config.model.build_tiny and (not Path(path).is_dir() or (Path(path) / STAMP).is_file()):
        # A tiny build with other settings is rebuilt; one with the same settings is reused as it is.
        build_tiny(path, seed=config.model.tiny_seed, **dataclasses.asdict(config.model.tiny))
    dtype = getattr(torch, config.model.dtype)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if config.model.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    if config.model.lora.enabled:
        model = apply_lora(model, config)
    return model, tokenizer


def _load_lora_checkpoint(path: Path, config: Config, device: torch.device) -> tuple[Any, Any]:
    """A LoRA checkpoint (adapter weights only) on top of the base model it names."""
    import json

    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        from peft import PeftModel
    except ImportError as exc:
        raise RuntimeError(f"{path} holds LoRA adapters; loading them needs peft: pip install 'agentfly[lora]'") from exc
    base = json.loads((path / "adapter_config.json").read_text()).get("base_model_name_or_path")
    if not base or not Path(base).is_dir():
        raise FileNotFoundError(f"{path}/adapter_config.json names base model {base!r}, which is not a local "
                                "directory; put the base model back there or edit base_model_name_or_path")
    model = AutoModelForCausalLM.from_pretrained(base, dtype=getattr(torch, config.model.dtype)).to(device)
    return PeftModel.from_pretrained(model, path, is_trainable=True), AutoTokenizer.from_pretrained(path)


def apply_lora(model: Any, config: Config) -> Any:
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as exc:
        raise RuntimeError("model.lora.enabled=true needs peft: pip install 'agentfly[lora]'") from exc
    lora = config.model.lora
    return get_peft_model(model, LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                            target_modules=list(lora.target_modules), task_type="CAUSAL_LM"))


def load_samples(config: Config) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Training and held-out samples. The built-in tasks have disjoint train and test splits:
    'arithmetic' (generated), 'wiki_qa' (the WIKI_MINI questions) and 'scienceworld' (its own variation splits)."""
    from agentfly.tasks import arithmetic, wiki_qa
    from agentfly.tasks.io import load_jsonl

    data = config.data
    builtin: dict[str, Any] = {
        "arithmetic": lambda split, n: arithmetic.generate(n, seed=data.seed, split=split),
        "wiki_qa": lambda split, n: wiki_qa.load(split),
        "scienceworld": lambda split, n: _scienceworld(split, data.seed),
    }
    if data.task in builtin:
        train = builtin[data.task]("train", data.train_size)
    elif Path(data.task).is_file():
        train = load_jsonl(data.task)
    else:
        raise FileNotFoundError(f"data.task={data.task!r} is neither a built-in task ({', '.join(builtin)}) nor an "
                                "existing JSONL file")
    if data.eval_path:
        held_out = load_jsonl(data.eval_path)[: data.eval_size]
    elif data.task in builtin:
        held_out = builtin[data.task]("test", data.eval_size)[: data.eval_size]
    else:
        raise ValueError("data.eval_path is required when data.task is a JSONL file (held-out samples)")
    if not train:
        raise ValueError(f"data.task={data.task!r} has no samples")
    return train, held_out


def _scienceworld(split: str, seed: int) -> list[dict[str, Any]]:
    from agentfly.envs.scienceworld import scienceworld_tasks

    return scienceworld_tasks(split, variations_per_task=5, seed=seed)


def build_resources(config: Config, tools: Sequence[Any]) -> ResourceEngine | None:
    """A ``ResourceEngine`` with a pool for every resource the tools declare or the config names (None if
    there are none): ``resources.<name>.spec`` when the config gives one, else the built-in spec
    (``agentfly.resources.builtin``). Pool sizes and timeouts from ``config.resources`` override the specs' own."""
    needed = dict.fromkeys([*config.resources, *(t.resource for t in tools if getattr(t, "resource", None))])
    if not needed:
        return None
    from agentfly.resources import ResourceEngine, UnknownResource
    from agentfly.resources.builtin import builtin_spec, with_pool

    specs = []
    for name in needed:
        res = config.resources.get(name)
        if res is not None and res.spec:
            spec = import_object(res.spec, f"resources.{name}.spec")
        else:
            try:
                spec = builtin_spec(name)
            except UnknownResource:
                raise ValueError(f"a tool needs resource {name!r}, which is not built in; add "
                                 f"resources.{name}.spec: 'module:attribute' (a ResourceSpec) to the config") from None
        if res is None:
            specs.append(with_pool(spec, name=name))
        else:
            specs.append(with_pool(spec, name=name, pool_min=res.min, pool_max=res.max,
                                   acquire_timeout=res.acquire_timeout))
    return ResourceEngine(specs)


def build_agent(config: Config, engine: Engine) -> Agent:
    import agentfly as af

    r = config.rollout
    tools = [import_object(spec, "rollout.tools entry") for spec in r.tools]
    reward = import_object(r.reward, "rollout.reward")
    return af.Agent(engine, tools=tools, reward=reward, parser=r.parser, max_turns=r.max_turns,
                    system_prompt=r.system_prompt, resources=build_resources(config, tools))


def build_engine(config: Config, model: Any, tokenizer: Any) -> Engine:
    """HF shares the trainer's module (weight sync is free); vLLM gets its own copy of the weights."""
    if config.engine == "hf":
        from agentfly.engines.hf import HFEngine

        return HFEngine(model=model, tokenizer=tokenizer)
    if config.engine == "vllm":
        from agentfly.engines import VLLMEngine  # imported only when asked for: vllm is an optional extra

        return VLLMEngine(config.model.path, seed=config.seed)
    raise ValueError(f"engine={config.engine!r}: use hf or vllm")


class DataCursor:
    """Walks the training samples in a seeded order, epoch after epoch; its state is part of a checkpoint."""

    def __init__(self, samples: Sequence[dict[str, Any]], seed: int, shuffle: bool = True) -> None:
        self.samples = list(samples)
        self.seed, self.shuffle = seed, shuffle
        self.epoch, self.position = 0, 0
        self._order = self._make_order()

    def _make_order(self) -> list[int]:
        order = list(range(len(self.samples)))
        if self.shuffle:
            random.Random(f"{self.seed}:{self.epoch}").shuffle(order)
        return order

    def take(self, n: int) -> list[dict[str, Any]]:
        out = []
        while len(out) < n:
            if self.position >= len(self._order):
                self.epoch, self.position = self.epoch + 1, 0
                self._order = self._make_order()
            out.append(self.samples[self._order[self.position]])
            self.position += 1
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position = state["epoch"], state["position"]
        self._order = self._make_order()


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


# ------------------------------------------------------------------------------------------ the batch


@dataclass
class Batch:
    """Trajectories as right-padded tensors. Per-token tensors are shifted to *predicted* tokens:
    position t is about token t + 1 (see ``trainer.algorithms.core``)."""

    input_ids: torch.Tensor  # [B, L]
    attention_mask: torch.Tensor  # [B, L]
    mask: torch.Tensor  # [B, L-1]  loss_mask[:, 1:]
    rollout_logprobs: torch.Tensor  # [B, L-1]
    rewards: torch.Tensor  # [B]  (after shaping)
    group_ids: torch.Tensor  # [B]

    @property
    def size(self) -> int:
        return self.input_ids.shape[0]

    def rows(self, index: torch.Tensor) -> Batch:
        return Batch(*(t.index_select(0, index) for t in (self.input_ids, self.attention_mask, self.mask,
                                                          self.rollout_logprobs, self.rewards, self.group_ids)))


def collate(trajectories: Sequence[Trajectory], rewards: Sequence[float], group_ids: Sequence[int], pad_id: int,
            device: torch.device) -> Batch:
    """Pad trajectories on the right into one batch; token ids and masks are taken as the rollout made them."""
    B = len(trajectories)
    L = max(len(t.token_ids) for t in trajectories)
    ids = torch.full((B, L), pad_id, dtype=torch.long)
    attn = torch.zeros((B, L), dtype=torch.long)
    loss_mask = torch.zeros((B, L), dtype=torch.long)
    logps = torch.zeros((B, L), dtype=torch.float32)
    for i, t in enumerate(trajectories):
        n = len(t.token_ids)
        ids[i, :n] = torch.tensor(t.token_ids)
        attn[i, :n] = 1
        loss_mask[i, :n] = torch.tensor(t.loss_mask)
        logps[i, :n] = torch.tensor(t.logprobs, dtype=torch.float32)
    return Batch(ids.to(device), attn.to(device), loss_mask[:, 1:].to(device), logps[:, 1:].to(device),
                 torch.tensor(list(rewards), dtype=torch.float32, device=device),
                 torch.tensor(list(group_ids), dtype=torch.long, device=device))


def _trim(batch: Batch, width: int) -> Batch:
    """The batch cut to ``width`` token positions (its longest row), dropping padding columns."""
    return Batch(batch.input_ids[:, :width], batch.attention_mask[:, :width], batch.mask[:, : width - 1],
                 batch.rollout_logprobs[:, : width - 1], batch.rewards, batch.group_ids)


def _agg_denominator(mask: torch.Tensor, mode: str) -> float:
    """What ``aggregate_loss`` divides by for ``mode``: trained tokens, sequences with trained tokens, or
    rows (``seq-mean-token-sum-norm``'s constant length cancels between micro-batch and minibatch)."""
    if mode == "token-mean":
        return float(mask.sum().clamp(min=1))
    if mode == "seq-mean-token-sum-norm":
        return float(mask.shape[0])
    return float((mask.sum(-1) > 0).sum().clamp(min=1))


def shared_prefix_length(batch: Batch, loss_mask_start: int, minimum: int = 16) -> int:
    """Length of the token prefix every row shares, capped before the first trained token (0 if short).

    Every trajectory of a batch starts with the same system prompt and tool schemas (most of its tokens on
    the tiny model); computing that prefix once and broadcasting its KV cache to all rows gives the same
    logprobs and the same gradients (``batch_repeat_interleave`` is differentiable) at a fraction of the cost.
    """
    ids = batch.input_ids
    if ids.shape[0] < 2:
        return 0
    same = (ids == ids[:1]).all(0) & (batch.attention_mask == 1).all(0)
    differs = (~same).nonzero()
    length = int(differs[0].item()) if differs.numel() else ids.shape[1]
    # Each row keeps at least one token of its own, and the prefix holds no trained token.
    length = min(length, loss_mask_start, ids.shape[1] - 1)
    return length if length >= minimum else 0


def forward(model: Any, batch: Batch, temperature: float, *, entropy: bool = False, hidden: bool = False,
            share_prefix: bool = True) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Logprobs of the batch's tokens [B, L-1], and optionally the entropy [B, L-1] and last hidden states
    [B, L-1, H] at the predicting positions. Positions inside a shared prompt prefix (all mask 0) hold 0."""
    B, L = batch.input_ids.shape
    trained = batch.mask.any(0).nonzero()
    first_trained = int(trained[0].item()) + 1 if trained.numel() else L - 1
    P = shared_prefix_length(batch, first_trained) if share_prefix else 0
    if P:
        pre = model(input_ids=batch.input_ids[:1, :P], use_cache=True, output_hidden_states=hidden)
        cache = pre.past_key_values
        cache.batch_repeat_interleave(B)
        positions = torch.arange(P, L, device=batch.input_ids.device).expand(B, L - P)
        out = model(input_ids=batch.input_ids[:, P:], attention_mask=batch.attention_mask,
                    past_key_values=cache, position_ids=positions, use_cache=True, output_hidden_states=hidden)
        # Predicting positions P-1 .. L-2: the prefix's last position, then all but the last suffix position.
        logits = torch.cat([pre.logits[:, -1:].expand(B, 1, -1), out.logits[:, :-1]], dim=1)
        h = (torch.cat([pre.hidden_states[-1][:, -1:].expand(B, 1, -1), out.hidden_states[-1][:, :-1]], dim=1)
             if hidden else None)
    else:
        out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, output_hidden_states=hidden,
                    use_cache=False)
        logits = out.logits[:, :-1]
        h = out.hidden_states[-1][:, :-1] if hidden else None
    start = max(P - 1, 0)
    logp_part = algos.token_logprobs(logits, batch.input_ids[:, start + 1:], temperature)
    logp = torch.nn.functional.pad(logp_part, (start, 0))
    ent = None
    if entropy:
        scaled = logits.float() / temperature if temperature != 1.0 else logits
        ent = torch.nn.functional.pad(algos.entropy_from_logits(scaled), (start, 0))
    if h is not None:
        h = torch.nn.functional.pad(h, (0, 0, start, 0))
    return logp, ent, h


# ------------------------------------------------------------------------------------------ the trainer


@contextlib.contextmanager
def _torch_threads(n: int) -> Iterator[None]:
    """Run the block with ``n`` torch threads (0: leave the count alone)."""
    before = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class StageTimer:
    """``with timer("rollout"):`` adds the block's wall time to ``timer.times["rollout"]``."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.times[name] = self.times.get(name, 0.0) + time.perf_counter() - start


def rollout_metrics(trajectories: Sequence[Trajectory], prefix: str = "") -> dict[str, float]:
    """Reward and behaviour statistics of a set of trajectories."""
    rewards = np.array([t.reward for t in trajectories], dtype=np.float64)
    lengths = np.array([t.num_trained_tokens for t in trajectories], dtype=np.float64)
    out = {
        f"{prefix}reward/mean": float(rewards.mean()), f"{prefix}reward/std": float(rewards.std()),
        f"{prefix}reward/min": float(rewards.min()), f"{prefix}reward/max": float(rewards.max()),
        f"{prefix}accuracy": float((rewards >= 1.0 - 1e-9).mean()),
        f"{prefix}response_length/mean": float(lengths.mean()), f"{prefix}response_length/max": float(lengths.max()),
        f"{prefix}turns/mean": float(np.mean([t.num_turns for t in trajectories])),
        f"{prefix}tool_calls/mean": float(np.mean([len(t.tool_calls) for t in trajectories])),
        f"{prefix}tool_errors/mean": float(np.mean([t.tool_errors for t in trajectories])),
        f"{prefix}parse_errors/mean": float(np.mean([t.parse_errors for t in trajectories])),
        f"{prefix}rollout_errors": float(sum(t.error is not None for t in trajectories)),
    }
    for reason in ("answer", "max_turns", "length", "error"):
        out[f"{prefix}finish/{reason}"] = float(np.mean([t.finish_reason == reason for t in trajectories]))
    return out


def evaluate(agent: Agent, samples: Sequence[dict[str, Any]], max_new_tokens: int, batch_size: int = 500
             ) -> tuple[dict[str, float], list[Trajectory]]:
    """Greedy decoding, one rollout per held-out sample; ``accuracy`` is the share with full reward."""
    import agentfly as af

    sampling = af.Sampling(temperature=0.0, max_new_tokens=max_new_tokens)
    trajectories: list[Trajectory] = []
    for start in range(0, len(samples), batch_size):
        trajectories += agent.run_sync(samples[start:start + batch_size], group_size=1, sampling=sampling)
    return rollout_metrics(trajectories, prefix="eval/"), trajectories


class Trainer:
    """Owns the policy module, the engine that shares it, the optimizer and the event stream of one run."""

    def __init__(self, config: Config, sinks: Sequence[Sink] = (), resume: str | os.PathLike[str] | None = None
                 ) -> None:
        self.config = config
        self.out = Path(config.output_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        save_config(config, self.out / "config.yaml")
        all_sinks: list[Sink] = [JSONLSink(self.out / "events.jsonl"), *sinks]
        if config.tensorboard:
            all_sinks.append(TensorBoardSink(self.out / "tensorboard"))
        self.events = EventStream(all_sinks, run=self.out.name)
        self.device = setup_torch(config)
        self.events.status(0, "running", f"loading {config.model.path}")
        self.model, self.tokenizer = load_policy(config, self.device)
        self.ref_model = None
        if config.algorithm.kl_coef > 0:
            self.ref_model = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.value_head = None
        params = [{"params": [p for p in self.model.parameters() if p.requires_grad], "lr": config.optim.lr}]
        if config.algorithm.name == "ppo":
            self.value_head = algos.ValueHead(self.model.config.hidden_size).to(self.device)
            params.append({"params": list(self.value_head.parameters()),
                           "lr": config.optim.critic_lr or config.optim.lr})
        o = config.optim
        self.optimizer = torch.optim.AdamW(params, lr=o.lr, betas=(o.betas[0], o.betas[1]), eps=o.eps,
                                           weight_decay=o.weight_decay)
        self.scheduler = make_scheduler(self.optimizer, config)
        self.ds_engine = None
        if config.deepspeed:
            from trainer.distributed import deepspeed_initialize, is_main_process, read_deepspeed_config

            # One backward per minibatch (its rows are DeepSpeed's micro-batch), clipped as optim.grad_clip says:
            # "auto" values of the DeepSpeed config take these, and the run directory keeps what was used.
            rows = config.rollout.prompts_per_step * config.rollout.group_size // config.algorithm.minibatches
            ds_config = read_deepspeed_config(
                config.deepspeed, micro_batch_size=max(rows, 1),
                gradient_clipping=config.optim.grad_clip if config.optim.grad_clip > 0 else None)
            if is_main_process():
                (self.out / "deepspeed.json").write_text(json.dumps(ds_config, indent=2) + "\n")
            self.ds_engine, self.optimizer = deepspeed_initialize(self.model, self.optimizer, ds_config)
        self.engine: Engine = build_engine(config, self.model, self.tokenizer)
        self.agent: Agent = build_agent(config, self.engine)
        self.pad_id = int(self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None
                          else self.tokenizer.eos_token_id)
        train, held_out = load_samples(config)
        self.cursor = DataCursor(train, config.data.seed, config.data.shuffle)
        self.eval_samples = held_out[: config.eval.size or config.data.eval_size]
        self.step = 0
        self.best: float | None = None
        if resume is not None:
            self._resume(resume)

    # -------------------------------------------------------------------------------------- resume / save
    def _resume(self, path: str | os.PathLike[str]) -> None:
        from safetensors.torch import load_file

        from trainer.checkpoint import resolve

        ckpt = resolve(path)
        state = load_state(ckpt)
        if (ckpt / "adapter_model.safetensors").is_file():  # LoRA: the checkpoint holds the adapters only
            from peft import set_peft_model_state_dict

            result = set_peft_model_state_dict(self.model, load_file(ckpt / "adapter_model.safetensors"))
            if result.unexpected_keys:
                raise ValueError(f"checkpoint {ckpt}: adapters do not fit this model ({result.unexpected_keys[:3]})")
            missing, unexpected = [], []
        else:
            weights = load_file(ckpt / "model.safetensors", device=str(self.device))
            missing, unexpected = self.model.load_state_dict(weights, strict=False)
        # Tied embeddings are saved once; anything else missing means the checkpoint is of another model.
        missing = [k for k in missing if k != "lm_head.weight"]
        if missing or unexpected:
            raise ValueError(f"checkpoint {ckpt} does not match model.path={self.config.model.path!r}: "
                             f"missing {missing[:3]}, unexpected {unexpected[:3]}")
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.cursor.load_state_dict(state["data"])
        if self.value_head is not None and "value_head" in state.get("extra_modules", {}):
            self.value_head.load_state_dict(state["extra_modules"]["value_head"])
        self.best = state.get("best")
        self.step = int(state["step"])
        set_rng_state(state["rng"])
        self.engine.update_weights(self.model.state_dict())
        self.events.log(self.step, f"resumed from {ckpt} at step {self.step}")

    def save(self, score: float | None = None) -> Path:
        if score is not None and (self.best is None or score > self.best):
            self.best = score
        state = {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                 "data": self.cursor.state_dict(), "best": self.best}
        extra = {"value_head": self.value_head} if self.value_head is not None else None
        path = save_checkpoint(self.out, self.step, model=self.model, tokenizer=self.tokenizer, state=state,
                               extra_modules=extra, score=score, keep_last=self.config.keep_last)
        save_config(self.config, path / "config.yaml")
        self.events.checkpoint(self.step, path, score)
        return path

    # -------------------------------------------------------------------------------------- stages
    def _sampling(self, round_index: int) -> Any:
        import agentfly as af

        r = self.config.rollout
        # A seed per (run seed, step, refill round): rollouts are reproducible, which resume relies on.
        seed = (self.config.seed * 1_000_003 + self.step * 101 + round_index) % (2**31)
        return af.Sampling(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                           max_new_tokens=r.max_new_tokens, seed=seed)

    def _shaped_rewards(self, trajectories: Sequence[Trajectory]) -> list[float]:
        a = self.config.algorithm
        rewards = torch.tensor([t.reward for t in trajectories], dtype=torch.float32)
        if a.overlong_buffer:
            lengths = torch.tensor([t.num_trained_tokens for t in trajectories])
            rewards = rewards + algos.overlong_penalty(lengths, a.overlong_max_tokens, a.overlong_buffer,
                                                       a.overlong_penalty)
        return rewards.tolist()

    def collect(self, timer: StageTimer) -> tuple[list[Any], list[Any], list[float], list[int], dict[str, float]]:
        """Rollouts for one step; with dynamic sampling, rounds of fresh prompts until the batch has
        ``prompts_per_step`` groups whose rewards differ (or ``max_sample_batches`` rounds were made).

        Returns (every trajectory sampled, the ones to train on, their shaped rewards, their group ids, metrics).
        """
        r, a = self.config.rollout, self.config.algorithm
        kept: list[Any] = []
        kept_rewards: list[float] = []
        kept_groups: list[int] = []
        everything: list[Any] = []
        rounds = a.max_sample_batches if a.resolved_dynamic_sampling else 1
        for round_index in range(rounds):
            samples = self.cursor.take(r.prompts_per_step)
            with timer("rollout"):
                trajectories = self.agent.run_sync(samples, group_size=r.group_size,
                                                   sampling=self._sampling(round_index))
            everything += trajectories
            with timer("reward"):
                shaped = self._shaped_rewards(trajectories)
                groups = [round_index * r.prompts_per_step + i // r.group_size for i in range(len(trajectories))]
                if a.resolved_dynamic_sampling:
                    keep = algos.informative_groups(torch.tensor(shaped), torch.tensor(groups)).tolist()
                else:
                    keep = [True] * len(trajectories)
                for t, s, g, k in zip(trajectories, shaped, groups, keep, strict=True):
                    if k:
                        kept.append(t)
                        kept_rewards.append(s)
                        kept_groups.append(g)
            if len(kept) >= r.prompts_per_step * r.group_size:
                break
        n = r.prompts_per_step * r.group_size
        extra = {"rollout/rounds": float(round_index + 1), "rollout/kept_fraction": len(kept) / max(len(everything), 1)}
        return everything, kept[:n], kept_rewards[:n], kept_groups[:n], extra

    def train_step(self) -> dict[str, float]:
        """One full step; returns its metrics (also emitted as an event)."""
        cfg = self.config
        timer = StageTimer()
        step_start, cpu_start = time.perf_counter(), time.process_time()
        self.model.eval()  # dropout off: rollout and training logprobs must be the same function
        everything, trajectories, rewards, groups, extra = self.collect(timer)
        metrics: dict[str, float] = rollout_metrics(everything) | extra
        gen_tokens = sum(t.num_trained_tokens for t in everything)
        metrics["tokens_per_second"] = gen_tokens / max(timer.times.get("rollout", 0.0), 1e-9)
        if trajectories:
            metrics |= self._update(trajectories, rewards, groups, timer)
        else:
            metrics["update/skipped"] = 1.0
        with timer("weight_sync"):
            if cfg.engine != "hf":
                self.engine.update_weights(self.model.state_dict())
        self.step += 1
        metrics |= {"lr": self.scheduler.get_last_lr()[0], "step": float(self.step)}
        metrics |= {f"time/{k}": v for k, v in timer.times.items()}
        metrics["time/step"] = time.perf_counter() - step_start
        # CPU seconds of this process: on a shared machine, wall time alone hides how much was ours.
        metrics["time/step_cpu"] = time.process_time() - cpu_start
        self.events.metrics(self.step, metrics)
        if cfg.log_samples:
            self.events.samples(self.step, [t.to_dict(self.tokenizer) for t in everything[: cfg.log_samples]])
        resources = self.agent.runner.resources
        self.events.resources(self.step, self.engine.stats(), resources.stats() if resources is not None else None)
        return metrics

    def _update(self, trajectories: Sequence[Trajectory], rewards: Sequence[float], groups: Sequence[int],
                timer: StageTimer) -> dict[str, float]:
        cfg, a = self.config, self.config.algorithm
        temperature = cfg.rollout.temperature
        metrics: dict[str, float] = {}
        with timer("logprobs"):
            batch = collate(trajectories, rewards, groups, self.pad_id, self.device)
            mask = batch.mask
            # Old logprobs for the ratio. One epoch of one minibatch is exactly on-policy: the current
            # logprobs (detached, in the update) are the old ones, so no extra forward is spent. Otherwise the
            # HF engine's own logprobs serve (same module, same weights; `logprob_mismatch` shows the gap),
            # and another engine's are recomputed by the trainer (verl's old_log_prob stage).
            on_policy = a.epochs == 1 and a.minibatches == 1
            recompute = not on_policy and cfg.engine != "hf"
            need_values = self.value_head is not None
            old_logp: torch.Tensor | None = None if on_policy else batch.rollout_logprobs
            values = None
            ref_logp = None
            with torch.no_grad():
                if recompute or need_values:
                    logp_now, _, hidden = forward(self.model, batch, temperature, hidden=need_values)
                    if recompute:
                        old_logp = logp_now
                    if need_values:
                        values = self.value_head(hidden)  # type: ignore[misc]
                if self.ref_model is not None:
                    ref_logp, _, _ = forward(self.ref_model, batch, temperature)
        with timer("advantages"):
            kl_reward = None
            if ref_logp is not None and a.kl_in_reward:
                behaviour = old_logp if old_logp is not None else batch.rollout_logprobs
                kl_reward = algos.kl_estimate(behaviour, ref_logp, a.kl_estimator)
            token_rewards = algos.outcome_token_rewards(batch.rewards, mask, kl_reward, a.kl_coef)
            advantages, returns = algos.compute_advantages(
                a.name, token_rewards, mask, batch.group_ids, values=values, std_normalize=a.std_normalize,
                gamma=a.gamma, lam=a.lam, whiten=a.whiten_advantages)
        with timer("update"), _torch_threads(cfg.update_threads):
            metrics |= self._optimise(batch, old_logp, ref_logp, advantages, values, returns)
        return metrics

    def _optimise(self, batch: Batch, old_logp: torch.Tensor | None, ref_logp: torch.Tensor | None,
                  advantages: torch.Tensor, values: torch.Tensor | None, returns: torch.Tensor | None
                  ) -> dict[str, float]:
        """Epochs x minibatches of optimizer steps. Each minibatch is run as length-sorted micro-batches
        whose gradients accumulate, each padded only to its own longest row; every loss term is weighted by
        its micro-batch's share of the minibatch's aggregation denominator, so the gradient is the one of
        the whole minibatch at once."""
        cfg, a = self.config, self.config.algorithm
        agg = a.resolved_loss_agg
        self.model.train()
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}
        norm_length = cfg.rollout.max_new_tokens * cfg.rollout.max_turns
        gen = torch.Generator().manual_seed(cfg.seed * 7_919 + self.step)
        lengths = batch.attention_mask.sum(-1).cpu()
        first = True
        for _ in range(a.epochs):
            order = torch.randperm(batch.size, generator=gen) if a.minibatches > 1 else torch.arange(batch.size)
            for rows in order.chunk(a.minibatches):
                rows = rows[torch.argsort(lengths[rows], stable=True)]
                size = batch.size if self.ds_engine is not None else cfg.micro_batch_size
                micro = list(rows.split(size))
                mb_mask = batch.mask.index_select(0, rows.to(self.device))
                denominator = _agg_denominator(mb_mask, agg)
                tokens_total = float(mb_mask.sum().clamp(min=1))
                parts: dict[str, float] = {}
                if self.ds_engine is None:
                    self.optimizer.zero_grad(set_to_none=True)
                for cpu_idx in micro:
                    idx = cpu_idx.to(self.device)
                    width = int(lengths[cpu_idx].max())
                    mb = _trim(batch.rows(idx), width)
                    mask = mb.mask
                    w = _agg_denominator(mask, agg) / denominator  # this micro-batch's share of the mean
                    w_tok = float(mask.sum()) / tokens_total  # its share of the tokens (for token means)

                    def cut(t: torch.Tensor, idx: torch.Tensor = idx, width: int = width) -> torch.Tensor:
                        return t.index_select(0, idx)[:, : width - 1]

                    logp, entropy, hidden = forward(self.model, mb, cfg.rollout.temperature, entropy=True,
                                                    hidden=self.value_head is not None)
                    if first:
                        # Same tokens, same weights: any gap is engine/trainer numerics (or a bug).
                        gap = (logp.detach() - mb.rollout_logprobs).abs()
                        parts["logprob_mismatch"] = parts.get("logprob_mismatch", 0.0) + w_tok * float(
                            algos.masked_mean(gap, mask))
                    old = logp.detach() if old_logp is None else cut(old_logp)
                    loss, pm = algos.clipped_policy_loss(
                        logp, old, cut(advantages), mask, clip_low=a.clip_low, clip_high=a.resolved_clip_high,
                        dual_clip=a.dual_clip, agg=agg, norm_length=norm_length)  # type: ignore[arg-type]
                    total = w * loss
                    terms = {"loss/policy": w * loss.item(), **{k: w_tok * v.item() for k, v in pm.items()}}
                    if ref_logp is not None:
                        kl = algos.kl_estimate(logp, cut(ref_logp), a.kl_estimator)
                        terms["kl"] = w_tok * algos.masked_mean(kl.detach(), mask).item()
                        if not a.kl_in_reward:
                            kl_loss = algos.aggregate_loss(kl, mask, agg, norm_length)  # type: ignore[arg-type]
                            total = total + w * a.kl_coef * kl_loss
                    if entropy is not None:
                        ent = algos.masked_mean(entropy, mask)
                        terms["entropy"] = w_tok * ent.item()
                        if a.entropy_coef:
                            total = total - w_tok * a.entropy_coef * ent
                    if self.value_head is not None:
                        assert values is not None and returns is not None and hidden is not None
                        vloss, vm = algos.clipped_value_loss(self.value_head(hidden), cut(values), cut(returns),
                                                             mask, clip=a.value_clip)
                        total = total + w_tok * a.vf_coef * vloss
                        terms["loss/value"] = w_tok * vloss.item()
                        terms |= {k: w_tok * v.item() for k, v in vm.items()}
                    terms["loss/total"] = total.item()
                    if self.ds_engine is not None:
                        self.ds_engine.backward(total)
                    else:
                        total.backward()
                    for k, v in terms.items():
                        parts[k] = parts.get(k, 0.0) + v
                first = False
                if self.ds_engine is not None:
                    self.ds_engine.step()
                    grad_norm = float(self.ds_engine.get_global_grad_norm() or 0.0)
                else:
                    params = [p for g in self.optimizer.param_groups for p in g["params"]]
                    clip = cfg.optim.grad_clip if cfg.optim.grad_clip > 0 else float("inf")
                    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, clip))
                    self.optimizer.step()
                parts["grad_norm"] = grad_norm
                for k, v in parts.items():
                    sums[k] = sums.get(k, 0.0) + v
                    counts[k] = counts.get(k, 0) + 1
        self.scheduler.step()
        self.model.eval()
        return {k: sums[k] / counts[k] for k in sums}

    def evaluate(self) -> dict[str, float]:
        metrics, _ = evaluate(self.agent, self.eval_samples, self.config.eval.max_new_tokens,
                              self.config.eval.batch_size)
        return metrics

    # -------------------------------------------------------------------------------------- the run
    def train(self, should_stop: Any = None) -> dict[str, Any]:
        """Run to ``steps`` (or the time budget); returns the final metrics and the last checkpoint path.

        should_stop: an optional callable checked between steps (the web app's cancel flag).
        """
        cfg = self.config
        self.events.status(self.step, "running", f"training from step {self.step} to {cfg.steps}")
        start = time.perf_counter()
        progress = _Progress(cfg.steps, self.step, enabled=cfg.progress)
        last: dict[str, float] = {}
        eval_metrics: dict[str, float] = {}
        state: RunState = "succeeded"
        try:
            while self.step < cfg.steps:
                if should_stop is not None and should_stop():
                    state = "cancelled"
                    break
                if cfg.max_minutes is not None and time.perf_counter() - start > cfg.max_minutes * 60:
                    self.events.log(self.step, f"time budget of {cfg.max_minutes} minutes reached")
                    break
                last = self.train_step()
                timer = StageTimer()
                due_eval = cfg.eval.every and self.step % cfg.eval.every == 0 and self.step < cfg.steps
                if due_eval:
                    with timer("eval"):
                        eval_metrics = self.evaluate()
                    self.events.metrics(self.step, eval_metrics | {"time/eval": timer.times["eval"]})
                if cfg.save_every and self.step % cfg.save_every == 0 and self.step < cfg.steps:
                    with timer("checkpoint"):
                        self.save(eval_metrics.get("eval/accuracy") if due_eval else None)
                    self.events.metrics(self.step, {"time/checkpoint": timer.times["checkpoint"]})
                progress.update(self.step, last | eval_metrics if due_eval else last)
            timer = StageTimer()
            with timer("eval"):
                eval_metrics = self.evaluate()
            with timer("checkpoint"):
                path = self.save(eval_metrics.get("eval/accuracy"))
            final = eval_metrics | {"time/eval": timer.times["eval"], "time/checkpoint": timer.times["checkpoint"],
                                    "time/train": time.perf_counter() - start}
            self.events.metrics(self.step, final)
            progress.close(final)
            self.events.status(self.step, state, f"checkpoint {path}")
            return {"metrics": last | final, "checkpoint": str(path), "state": state, "step": self.step}
        except BaseException as exc:
            self.events.status(self.step, "failed", f"{type(exc).__name__}: {exc}")
            raise
        finally:
            resources = self.agent.runner.resources
            if resources is not None:
                resources.close()  # kills sandboxes and environments; the rollouts have all ended
            self.events.close()


class _Progress:
    """A tqdm bar with one table row per step (``tqdm.write`` keeps the bar at the bottom)."""

    COLUMNS = (("step", "step", "{:>5.0f}"), ("reward", "reward/mean", "{:>7.3f}"), ("acc", "accuracy", "{:>6.3f}"),
               ("loss", "loss/policy", "{:>8.4f}"), ("kl", "kl", "{:>7.4f}"), ("entropy", "entropy", "{:>7.3f}"),
               ("clip", "clip_fraction", "{:>6.3f}"), ("len", "response_length/mean", "{:>6.1f}"),
               ("eval", "eval/accuracy", "{:>6.3f}"), ("sec", "time/step", "{:>6.2f}"))

    def __init__(self, total: int, initial: int, enabled: bool) -> None:
        self.enabled = enabled
        if not enabled:
            return
        from tqdm import tqdm

        self.bar = tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True, file=sys.stderr)
        self.bar.write(" ".join(f"{name:>{len(fmt.format(0.0))}}" for name, _, fmt in self.COLUMNS))

    def update(self, step: int, metrics: dict[str, float]) -> None:
        if not self.enabled:
            return
        row = []
        for name, key, fmt in self.COLUMNS:
            width = len(fmt.format(0.0))
            value = metrics.get(key)
            row.append(fmt.format(value) if isinstance(value, (int, float)) else f"{'-':>{width}}")
            _ = name
        self.bar.write(" ".join(row))
        self.bar.update(step - self.bar.n)

    def close(self, final: dict[str, float]) -> None:
        if not self.enabled:
            return
        self.bar.close()
        acc = final.get("eval/accuracy")
        if acc is not None:
            print(f"eval accuracy {acc:.3f} on held-out problems", file=sys.stderr)


def train(config: Config, sinks: Sequence[Sink] = (), resume: str | os.PathLike[str] | None = None,
          should_stop: Any = None) -> dict[str, Any]:
    """Train with ``config``, streaming events to ``sinks`` (plus ``<output_dir>/events.jsonl``)."""
    return Trainer(config, sinks=sinks, resume=resume).train(should_stop=should_stop)
