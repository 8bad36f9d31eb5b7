"""The training loop: one step is a sequence of named, timed stages (after verl's ``ray_trainer``)::

    rollout      sample `group_size` trajectories per prompt through ``agentfly.Agent`` (rewards are scored
                 by the rollout layer as each trajectory ends)
    reward       collect rewards, overlong shaping, DAPO dynamic sampling (drop and refill flat groups)
    logprobs     pad the batch; old logprobs (the engine's, or recomputed), reference logprobs, values
    advantages   the algorithm's estimator over mask-1 tokens (``trainer.algorithms``)
    update       epochs x minibatches of the masked clipped loss, gradient clipping, optimizer + scheduler
    weight_sync  the engine gets the new weights (in place for HF: it shares the module)
    eval         held-out pass@1 (greedy), turns, tool-error rate; pass@k if configured (``trainer.evaluation``)
    checkpoint   safetensors + optimizer/scheduler/RNG/data position (every `save_every` steps and at the end)

With ``rollout.mode: async`` the rollout and reward stages run on a producer thread ahead of the update
(``trainer.producer``); the step waits for its batch (``wait_for_batch``), and ``weight_sync`` publishes a
copy of the new weights to the producer.

Each stage's seconds are reported as ``time/<stage>`` in the step's metrics event. What a run is built from
(model, data, engine, agent, resource pools) is in ``trainer.builders``; the padded batch and the forward pass
in ``trainer.batch``; the optimizer, its schedule and the torch/DeepSpeed ``Update`` in ``trainer.optim``.

    python -m trainer.cli train examples/calculator/grpo.yaml
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
import shutil
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from trainer import algorithms as algos
from trainer import distributed as dist
from trainer.batch import Batch, agg_denominator, collate, forward, trim, turn_layout
from trainer.builders import (
    DataCursor,
    build_agent,
    build_engine,
    ensure_tiny,
    load_policy,
    load_samples,
    pools_of,
    setup_torch,
)
from trainer.checkpoint import load_state, partial_path, rng_state, save_checkpoint, set_rng_state
from trainer.config import Config, ConfigError, save_config
from trainer.evaluation import evaluate, sampled_eval
from trainer.events import EventStream, JSONLSink, RunState, Sink
from trainer.optim import Actor, DeepSpeedUpdate, make_scheduler, make_update
from trainer.producer import ProducedBatch, RolloutProducer
from trainer.trackers import tracker_sinks

if TYPE_CHECKING:
    from agentfly.agents.agent import Agent
    from agentfly.engines.base import Engine
    from agentfly.rollout.trajectory import Trajectory

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


def summary(t: Trajectory) -> dict[str, Any]:
    """The few numbers of a trajectory its metrics need (what ranks exchange, not the whole trajectory)."""
    return {"reward": t.reward, "length": t.num_trained_tokens, "turns": t.num_turns, "tool_calls": len(t.tool_calls),
            "tool_errors": t.tool_errors, "parse_errors": t.parse_errors, "error": t.error is not None,
            "finish": t.finish_reason, "failure": t.failure}


def infra_kept(trajectories: Sequence[Trajectory], groups: Sequence[int], mode: str) -> list[bool]:
    """Which trajectories stay in training: not those the infrastructure ended (``Trajectory.failure``).

    ``exclude`` drops each failed trajectory alone; ``drop_group`` drops every group that holds one.
    """
    if mode == "exclude":
        return [not t.infra_failed for t in trajectories]
    if mode == "drop_group":
        broken = {g for t, g in zip(trajectories, groups, strict=True) if t.infra_failed}
        return [g not in broken for g in groups]
    raise ValueError(f"Unknown infra_failures mode: {mode!r}; use 'exclude' or 'drop_group'")


def rollout_metrics(trajectories: Sequence[Trajectory], prefix: str = "") -> dict[str, float]:
    """Reward and behaviour statistics of a set of trajectories."""
    return summary_metrics([summary(t) for t in trajectories], prefix)


def summary_metrics(rows: Sequence[dict[str, Any]], prefix: str = "") -> dict[str, float]:
    """``rollout_metrics`` of trajectories given by their ``summary`` (gathered from every rank).

    Trajectories that ended in an infrastructure failure are counted (``rollout/infra_failed``, and by kind)
    and left out of every other statistic: their reward says nothing of the agent.
    """
    failures = Counter(r["failure"] for r in rows if r.get("failure"))
    counts = {f"{prefix}rollout/infra_failed": float(sum(failures.values()))}
    counts |= {f"{prefix}rollout/infra_failed/{kind}": float(n) for kind, n in sorted(failures.items())}
    rows = [r for r in rows if not r.get("failure")]
    if not rows:
        return counts
    rewards = np.array([r["reward"] for r in rows], dtype=np.float64)
    lengths = np.array([r["length"] for r in rows], dtype=np.float64)
    out = counts | {
        f"{prefix}reward/mean": float(rewards.mean()), f"{prefix}reward/std": float(rewards.std()),
        f"{prefix}reward/min": float(rewards.min()), f"{prefix}reward/max": float(rewards.max()),
        f"{prefix}accuracy": float((rewards >= 1.0 - 1e-9).mean()),
        f"{prefix}response_length/mean": float(lengths.mean()), f"{prefix}response_length/max": float(lengths.max()),
        f"{prefix}turns/mean": float(np.mean([r["turns"] for r in rows])),
        f"{prefix}tool_calls/mean": float(np.mean([r["tool_calls"] for r in rows])),
        f"{prefix}tool_errors/mean": float(np.mean([r["tool_errors"] for r in rows])),
        f"{prefix}parse_errors/mean": float(np.mean([r["parse_errors"] for r in rows])),
        f"{prefix}rollout_errors": float(sum(r["error"] for r in rows)),
    }
    for reason in ("answer", "max_turns", "length", "error"):
        out[f"{prefix}finish/{reason}"] = float(np.mean([r["finish"] == reason for r in rows]))
    return out


@dataclass
class Collected:
    """What the rollout and reward stages of one step produced."""

    everything: list[Trajectory]  # every trajectory sampled (all rounds), for metrics and samples
    trajectories: list[Trajectory]  # the ones to train on
    rewards: list[float]  # their shaped rewards
    groups: list[int]  # their group ids
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class MicroBatch:
    """One micro-batch of a minibatch: its rows (cut to their longest), the per-token tensors cut alike, and
    its weights in the minibatch's loss (``weight``) and token means (``token_weight``)."""

    batch: Batch
    old_logp: torch.Tensor | None  # None: on-policy, the current logprobs (detached) are the old ones
    advantages: torch.Tensor
    ref_logp: torch.Tensor | None
    values: torch.Tensor | None
    returns: torch.Tensor | None
    weight: float
    token_weight: float
    measure_mismatch: bool  # the first minibatch measures rollout-vs-trainer logprobs


def _reduce_metrics(values: dict[str, float]) -> dict[str, float]:
    """The mean over ranks of per-rank metrics that are each already a share of the whole batch's value
    (weighted by the global denominators, times the world size), so their mean is the one-process value;
    ``*_max`` metrics (the off-policy weights' maximum) are the maximum over ranks."""
    keys = sorted(k for k in values if not k.endswith("_max"))
    maxima = sorted(k for k in values if k.endswith("_max"))  # a maximum's one-process value is the max
    world = dist.world_size()
    reduced: dict[str, float] = {}
    if keys:
        summed = dist.all_reduce_sum(torch.tensor([values[k] for k in keys], dtype=torch.float64))
        reduced.update({k: float(v) / world for k, v in zip(keys, summed.tolist(), strict=True)})
    if maxima:
        top = dist.all_reduce_max(torch.tensor([values[k] for k in maxima], dtype=torch.float64))
        reduced.update({k: float(v) for k, v in zip(maxima, top.tolist(), strict=True)})
    return reduced


class InfrastructureStop(RuntimeError):
    """The job stopped because the infrastructure failed every rollout of several steps in a row."""


class Trainer:
    """Owns the policy module, the engine that shares it, the optimizer and the event stream of one run.

    Under a launcher (``torchrun``, ``deepspeed``) each of the N ranks builds one: every rank rolls out its
    own ``prompts_per_step / N`` prompts of the shared data order, the losses' denominators, whole-batch
    statistics and metrics are reduced across ranks, gradients are averaged by DDP or DeepSpeed, and rank 0
    alone emits events, evaluates and writes the Hugging Face weights.

    engine: a rollout engine built by the caller (e.g. a ``ReplayEngine`` for scripted rollouts) instead of
    the one ``config.engine`` names.
    """

    def __init__(self, config: Config, sinks: Sequence[Sink] = (), resume: str | os.PathLike[str] | None = None,
                 engine: Engine | None = None) -> None:
        self.config = config
        self.world, self.rank = dist.world_size(), dist.rank()
        # Refused before anything is loaded: a launch that cannot compute the one-process step.
        dist.check_world(config, self.world, colocated_hf=engine is None and config.engine == "hf")
        if resume is not None:
            self._check_resume_world(resume)
        if self.world > 1:
            dist.init_process_group()
        self.main = self.rank == 0
        self.out = Path(config.output_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        all_sinks: list[Sink] = []
        if self.main:  # one writer: the other ranks' events would be copies of rank 0's
            save_config(config, self.out / "config.yaml")
            all_sinks = [JSONLSink(self.out / "events.jsonl"), *sinks, *tracker_sinks(config, self.out)]
        self.events = EventStream(all_sinks, run=self.out.name)
        self.device = setup_torch(config)
        if self.device.type == "cuda" and self.world > 1:
            self.device = torch.device("cuda", dist.local_rank())
        self.events.status(0, "running", f"loading {config.model.path}")
        if self.world > 1 and config.model.build_tiny:
            if self.main:
                ensure_tiny(config)
            dist.barrier()  # the other ranks load what rank 0 built (and reuse it: same settings)
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
        self.optimizer: Any = torch.optim.AdamW(params, lr=o.lr, betas=(o.betas[0], o.betas[1]), eps=o.eps,
                                                weight_decay=o.weight_decay)
        self.scheduler = make_scheduler(self.optimizer, config)
        # Plain torch, DDP or DeepSpeed, chosen once: the update stage steps through `self.update` either way.
        # The value head is inside the same module, so DDP averages and DeepSpeed shards and saves it too.
        self.update = make_update(config, Actor(self.model, self.value_head), self.optimizer, self.out, self.world)
        self.optimizer = self.update.optimizer
        self.zero3 = (config.deepspeed is not None
                      and dist.zero_stage(dist.read_deepspeed_config(config.deepspeed)) == 3)
        # ZeRO-3 gathers parameters in every forward, a collective: all ranks must make the same number of
        # forward calls, so the shared-prefix trick (one more call when a batch's rows share a long prompt) is off.
        self.share_prefix = not self.zero3
        self.engine: Engine = engine if engine is not None else build_engine(config, self.model, self.tokenizer)
        self._owns_engine = engine is None  # closed when train() ends; a caller's engine is the caller's
        self.separate_engine = engine is not None or config.engine != "hf"  # holds its own copy of the weights
        if config.rollout.mode == "async" and (engine is not None or self.zero3):
            why = "a caller-built engine" if engine is not None else "DeepSpeed ZeRO-3 (its weights are sharded)"
            raise ConfigError(f"rollout.mode=async gives the producer an engine of its own, which {why} does not "
                              "allow; use rollout.mode=sync" + ("" if engine is not None else
                                                                 ", or a ZeRO stage below 3"), key="rollout.mode")
        self.agent: Agent = build_agent(config, self.engine)
        # build_agent gives the agent build_resources' engine (or none): the trainer reports and closes it.
        self.resources = pools_of(self.agent)
        self.pad_id = int(self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None
                          else self.tokenizer.eos_token_id)
        train, held_out = load_samples(config)
        self.cursor = DataCursor(train, config.data.seed, config.data.shuffle)
        self.eval_samples = held_out[: config.eval.size or config.data.eval_size]
        self.step = 0
        self.best: float | None = None
        self.producer: RolloutProducer | None = None  # rollout.mode=async, while train() runs
        self._producer_engine: Engine | None = None
        self._producer_agent: Agent | None = None
        self._producer_idle = 0.0  # the producer's idle seconds already reported
        self._infra_streak = 0  # steps in a row whose every rollout the infrastructure ended
        self._async_eval_agent: Agent | None = None  # async mode: evaluations run on this (_eval_agent)
        if resume is not None:
            self._resume(resume)

    # -------------------------------------------------------------------------------------- resume / save
    def _check_resume_world(self, path: str | os.PathLike[str]) -> None:
        saved = int(load_state(path).get("world_size", 1))
        if saved != self.world and self.config.deepspeed:
            raise ConfigError(
                f"checkpoint {path} was saved by {saved} DeepSpeed ranks and this launch has {self.world}: each "
                f"rank's ZeRO optimizer slice cannot be resharded here; resume with {saved} ranks (torchrun "
                f"--nproc_per_node {saved}), or start a new run from its weights (--set model.path={path})")

    def _resume(self, path: str | os.PathLike[str]) -> None:
        from safetensors.torch import load_file

        from trainer.checkpoint import resolve

        ckpt = resolve(path)
        state = load_state(ckpt)
        if isinstance(self.update, DeepSpeedUpdate):
            if not (ckpt / "deepspeed").is_dir():
                raise ConfigError(f"checkpoint {ckpt} has no DeepSpeed state (it was saved without deepspeed=); "
                                  f"resume it without deepspeed=, or start a new run from its weights "
                                  f"(--set model.path={ckpt})")
            # DeepSpeed's own checkpoint: module (policy and value head) and this rank's optimizer slice.
            self.update.engine.load_checkpoint(str(ckpt / "deepspeed"), tag="state", load_optimizer_states=True,
                                               load_lr_scheduler_states=False)
            self._resume_rest(ckpt, state)
            return
        if (ckpt / "adapter_model.safetensors").is_file():  # LoRA: the checkpoint holds the adapters only
            from peft import set_peft_model_state_dict

            result: Any = set_peft_model_state_dict(self.model, load_file(ckpt / "adapter_model.safetensors"))
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
        if self.value_head is not None and "value_head" in state.get("extra_modules", {}):
            self.value_head.load_state_dict(state["extra_modules"]["value_head"])
        self._resume_rest(ckpt, state)

    def _resume_rest(self, ckpt: Path, state: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state["scheduler"])
        self.cursor.load_state_dict(state["data"])
        self.best = state.get("best")
        self.step = int(state["step"])
        # This rank's RNG states; a plain-torch run resumed on more ranks than it was saved with (its
        # optimizer state is the same on every rank, so it reshards freely) starts the new ranks from rank 0's.
        mine = ckpt / f"rank-{self.rank:05d}.pt"
        set_rng_state(torch.load(mine, weights_only=False)["rng"] if mine.is_file() else state["rng"])
        self._sync_weights()
        saved = int(state.get("world_size", 1))
        note = f" (saved by {saved} ranks)" if saved != self.world else ""
        ahead = state.get("producer")
        if ahead is not None and int(ahead["next_step"]) > self.step:
            # Sampled ahead but never trained: sampled again from the trained cursor, same prompts and seeds.
            note += (f"; the producer had sampled to step {ahead['next_step']}, those batches are sampled again "
                     f"from step {self.step}")
        self.events.log(self.step, f"resumed from {ckpt} at step {self.step} on {self.world} ranks{note}")

    def _sync_weights(self) -> None:
        """The rollout engine gets the current weights (whole: gathered first under ZeRO-3, on every rank)."""
        self.engine.update_weights(dist.full_state_dict(self.model) if self.zero3 else self.model.state_dict())

    def save(self, score: float | None = None) -> Path:
        """A checkpoint; every rank calls it (it is a collective). Each rank writes its RNG states, and
        under DeepSpeed its share of DeepSpeed's checkpoint; rank 0 writes the whole weights and the rest."""
        if score is not None and (self.best is None or score > self.best):
            self.best = score
        tmp = partial_path(self.out, self.step)
        if self.main:
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir(parents=True)
        dist.barrier()
        torch.save({"rng": rng_state()}, tmp / f"rank-{self.rank:05d}.pt")
        deepspeed = isinstance(self.update, DeepSpeedUpdate)
        if isinstance(self.update, DeepSpeedUpdate):
            self.update.engine.save_checkpoint(str(tmp / "deepspeed"), tag="state")
        weights = dist.full_state_dict(self.model) if self.zero3 else None  # gathered on every rank
        path = self.out / f"checkpoint-{self.step:06d}"
        if self.main:
            state = {"scheduler": self.scheduler.state_dict(), "data": self.cursor.state_dict(), "best": self.best,
                     "world_size": self.world}
            if self.producer is not None:  # "data" is the cursor after the last trained batch; this, the ahead
                state["producer"] = self.producer.state_dict()
            if not deepspeed:  # replicated on every rank, so rank 0's is everyone's
                state["optimizer"] = self.optimizer.state_dict()
            extra: dict[str, torch.nn.Module] | None = (
                {"value_head": self.value_head} if self.value_head is not None and not deepspeed else None)
            path = save_checkpoint(self.out, self.step, model=self.model, tokenizer=self.tokenizer, state=state,
                                   extra_modules=extra, score=score, keep_last=self.config.keep_last,
                                   weights=weights, started=True)
            save_config(self.config, path / "config.yaml")
            self.events.checkpoint(self.step, path, score)
        dist.barrier()
        return path

    # -------------------------------------------------------------------------------------- stages
    def _sampling(self, round_index: int, step: int | None = None) -> Any:
        import agentfly as af

        r = self.config.rollout
        step = self.step if step is None else step
        # A seed per (run seed, step, refill round): rollouts are reproducible, which resume relies on.
        seed = (self.config.seed * 1_000_003 + step * 101 + round_index) % (2**31)
        return af.Sampling(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                           max_new_tokens=r.max_new_tokens, seed=seed)

    def _shaped_rewards(self, trajectories: Sequence[Trajectory]) -> list[float]:
        a = self.config.algorithm
        # Outcome credit trains on the sequence's whole score: its outcome plus the rewards of its turns. The
        # turn-level estimators place each turn's reward on that turn instead (``turn_layout``).
        outcome = a.credit == "outcome"
        rewards = torch.tensor([t.reward + (sum(t.rewards_per_turn()) if outcome else 0.0) for t in trajectories],
                               dtype=torch.float32)
        if a.overlong_buffer:
            lengths = torch.tensor([t.num_trained_tokens for t in trajectories])
            rewards = rewards + algos.overlong_penalty(lengths, a.overlong_max_tokens, a.overlong_buffer,
                                                       a.overlong_penalty)
        return rewards.tolist()

    def collect(self, timer: StageTimer, *, agent: Agent | None = None, cursor: DataCursor | None = None,
                step: int | None = None, group: Any = None) -> Collected:
        """Rollouts for one step; with dynamic sampling, rounds of fresh prompts until the batch has
        ``prompts_per_step`` groups whose rewards differ (or ``max_sample_batches`` rounds were made).

        The asynchronous producer passes its own ``agent`` (engine copy), ``cursor``, the ``step`` the batch
        is for, and its side process ``group`` for the cross-rank counts; by default, the trainer's own.

        Across ranks every rank takes the same ``prompts_per_step`` prompts from the shared order and rolls
        out its own slice of them; a round's kept count and the stop are decided on the whole batch, and the
        batch is cut to the first ``prompts_per_step * group_size`` kept rows in the one-process order
        (round by round, rank by rank), so the N ranks train on exactly the rows one process would.
        """
        r, a = self.config.rollout, self.config.algorithm
        share = r.prompts_per_step // self.world
        first = self.rank * share  # this rank's first prompt of the round
        kept: list[list[tuple[Trajectory, float, int]]] = []  # per round
        counts: list[list[int]] = []  # per round, per rank: rows kept
        everything: list[Trajectory] = []
        refill = a.resolved_dynamic_sampling or r.infra_failures == "drop_group"
        rounds = a.max_sample_batches if refill else 1
        n = r.prompts_per_step * r.group_size
        agent = self.agent if agent is None else agent
        cursor = self.cursor if cursor is None else cursor
        for round_index in range(rounds):
            samples = cursor.take(r.prompts_per_step)[first:first + share]
            with timer("rollout"):
                # Seeds follow the rollout's index in the whole round, so rank r samples its prompts as one
                # process doing every prompt would.
                trajectories = agent.run_sync(samples, group_size=r.group_size,
                                              sampling=self._sampling(round_index, step),
                                              first_index=first * r.group_size)
            everything += trajectories
            with timer("reward"):
                groups = [round_index * r.prompts_per_step + first + i // r.group_size
                          for i in range(len(trajectories))]
                # A trajectory the infrastructure ended is not the agent's failure: it leaves its group before
                # any statistic is taken, so the group's mean, std and the loss are those of the rest.
                healthy = infra_kept(trajectories, groups, r.infra_failures)
                trajectories = [t for t, k in zip(trajectories, healthy, strict=True) if k]
                groups = [g for g, k in zip(groups, healthy, strict=True) if k]
                shaped = self._shaped_rewards(trajectories)
                if a.resolved_dynamic_sampling and trajectories:
                    keep = algos.informative_groups(torch.tensor(shaped), torch.tensor(groups)).tolist()
                else:
                    keep = [True] * len(trajectories)
                kept.append([(t, s, g) for t, s, g, k in zip(trajectories, shaped, groups, keep, strict=True) if k])
                mine = torch.zeros(self.world, dtype=torch.float64)
                mine[self.rank] = len(kept[-1])
                counts.append([int(c) for c in dist.all_reduce_sum(mine, group).tolist()])
            if sum(map(sum, counts)) >= n:
                break
        rows: list[tuple[Trajectory, float, int]] = []
        before = 0  # kept rows ahead of this rank's, in the one-process order
        for round_rows, round_counts in zip(kept, counts, strict=True):
            ahead = before + sum(round_counts[: self.rank])
            rows += round_rows[: max(0, min(len(round_rows), n - ahead))]
            before += sum(round_counts)
        sampled = float(dist.all_reduce_sum(torch.tensor(float(len(everything)), dtype=torch.float64), group))
        extra = {"rollout/rounds": float(round_index + 1),
                 "rollout/kept_fraction": sum(map(sum, counts)) / max(sampled, 1.0)}
        return Collected(everything, [t for t, _, _ in rows], [s for _, s, _ in rows], [g for _, _, g in rows],
                         extra)

    def train_step(self) -> dict[str, float]:
        """One full step; returns its metrics (also emitted as an event)."""
        cfg = self.config
        timer = StageTimer()
        step_start, cpu_start = time.perf_counter(), time.process_time()
        self.model.eval()  # dropout off: rollout and training logprobs must be the same function
        produced: ProducedBatch | None = None
        dropped = 0
        if self.producer is None:
            collected = self.collect(timer)
        else:
            with timer("wait_for_batch"):  # the trainer's idle time: the producer is behind
                produced, dropped = self.producer.get(self.step)
            self.cursor.load_state_dict(produced.cursor)  # the trained position, what a checkpoint saves
            collected = produced.collected
        everything = collected.everything
        # Every rank's trajectories count in the metrics (gathered as a few numbers each).
        rows = [row for part in dist.all_gather_object([summary(t) for t in everything]) for row in part]
        metrics: dict[str, float] = summary_metrics(rows) | collected.metrics
        train_rows = int(dist.all_reduce_sum(torch.tensor(float(len(collected.trajectories)))))
        if train_rows:
            # A rank left without rows (dynamic sampling kept others' groups) still meets the gradient
            # all-reduce, with a placeholder row whose mask is all 0: it adds nothing to loss or metrics.
            placeholder = not collected.trajectories
            trajectories = collected.trajectories or everything[:1]
            metrics |= self._update(trajectories, collected.rewards or [0.0], collected.groups or [0], timer,
                                    placeholder=placeholder)
        else:
            metrics["update/skipped"] = 1.0
        with timer("weight_sync"):
            if self.producer is not None:
                if self.step + 1 < cfg.steps:
                    # A copy, so the producer can swap it in (between two of its batches, never while its
                    # engine decodes) while the next update changes the trainer's own.
                    self.producer.publish({k: v.detach().clone() for k, v in self.model.state_dict().items()},
                                          self.step + 1)
            elif self.separate_engine:
                self._sync_weights()
        self.step += 1
        metrics |= {"lr": float(self.scheduler.get_last_lr()[0]), "step": float(self.step)}
        # A step waits for its slowest rank: stage times are the maximum over ranks, CPU seconds the sum.
        names = sorted(timer.times)
        slowest = dist.all_reduce_max(torch.tensor([timer.times[k] for k in names] +
                                                   [time.perf_counter() - step_start], dtype=torch.float64)).tolist()
        metrics |= {f"time/{k}": v for k, v in zip(names, slowest, strict=False)}
        metrics["time/step"] = slowest[-1]
        if produced is not None:
            metrics |= self._async_metrics(produced, dropped, collected.trajectories)
        gen_tokens = float(dist.all_reduce_sum(torch.tensor(float(sum(t.num_trained_tokens for t in everything)),
                                                            dtype=torch.float64)))
        metrics["tokens_per_second"] = gen_tokens / max(metrics.get("time/rollout", 0.0), 1e-9)
        # CPU seconds of the processes: on a shared machine, wall time alone hides how much was ours.
        metrics["time/step_cpu"] = float(dist.all_reduce_sum(torch.tensor(time.process_time() - cpu_start,
                                                                          dtype=torch.float64)))
        self.events.metrics(self.step, metrics)
        if cfg.log_samples and self.main:
            shown = everything if cfg.log_samples < 0 else everything[: cfg.log_samples]
            self.events.samples(self.step, [t.to_dict(self.tokenizer) for t in shown])
        # The engine and pools the rollouts ran on: the producer's in async mode.
        engine = self.engine if self._producer_engine is None else self._producer_engine
        pools = self.resources if self._producer_agent is None else pools_of(self._producer_agent)
        self.events.resources(self.step, engine.stats(), pools.stats() if pools else None)
        self._check_infrastructure(everything, metrics, len(rows))
        return metrics

    def _check_infrastructure(self, everything: Sequence[Trajectory], metrics: dict[str, float], rolled: int) -> None:
        """Stop a job that trains on nothing: every rollout of ``rollout.max_infra_failed_steps`` steps in a
        row ended in an infrastructure failure (a pool that cannot start, a cluster gone). Such steps would
        otherwise succeed with every update skipped."""
        limit = self.config.rollout.max_infra_failed_steps
        failed = metrics.get("rollout/infra_failed", 0.0)
        self._infra_streak = self._infra_streak + 1 if rolled and failed >= rolled else 0
        if not limit or self._infra_streak < limit:
            return
        first = next((t for t in everything if t.infra_failed), None)
        why = f"{first.failure}: {first.failure_reason}" if first is not None else "on another rank"
        raise InfrastructureStop(
            f"every rollout of the last {self._infra_streak} steps ended in an infrastructure failure ({why}), so "
            "nothing was trained; fix what the reason names and resume from the last checkpoint, or raise "
            "rollout.max_infra_failed_steps (0 never stops)")

    def _async_metrics(self, produced: ProducedBatch, dropped: int, trained: Sequence[Trajectory]
                       ) -> dict[str, float]:
        """Staleness of the trained rows (versions behind this update), dropped batches, the producer's stage
        seconds for this batch (it ran them while earlier updates did) and its idle seconds since the last
        step; over ranks: sums for means and counts, maxima for maxima and times."""
        assert self.producer is not None
        start = self.step - 1  # the version this update started from (self.step has counted it already)
        lags = [start - (t.policy_version if t.policy_version is not None else start) for t in trained]
        idle, self._producer_idle = self.producer.idle_seconds - self._producer_idle, self.producer.idle_seconds
        summed = dist.all_reduce_sum(torch.tensor([float(sum(lags)), float(len(lags)), float(dropped)],
                                                  dtype=torch.float64)).tolist()
        names = sorted(produced.times)
        top = dist.all_reduce_max(torch.tensor([float(max(lags, default=0)), idle] +
                                               [produced.times[k] for k in names], dtype=torch.float64)).tolist()
        out = {"rollout/staleness_mean": summed[0] / max(summed[1], 1.0), "rollout/staleness_max": top[0],
               "rollout/dropped_stale": summed[2], "time/producer_idle": top[1],
               "rollout/policy_version": float(produced.version)}
        return out | {f"time/{k}": v for k, v in zip(names, top[2:], strict=True)}

    def _update(self, trajectories: Sequence[Trajectory], rewards: Sequence[float], groups: Sequence[int],
                timer: StageTimer, placeholder: bool = False) -> dict[str, float]:
        cfg, a = self.config, self.config.algorithm
        temperature = cfg.rollout.temperature
        metrics: dict[str, float] = {}
        with timer("logprobs"):
            batch = collate(trajectories, rewards, groups, self.pad_id, self.device)
            if placeholder:
                batch = dataclasses.replace(batch, mask=torch.zeros_like(batch.mask))
            mask = batch.mask
            # Old logprobs for the ratio. One epoch of one minibatch is exactly on-policy: the current
            # logprobs (detached, in the update) are the old ones, so no extra forward is spent. Otherwise the
            # HF engine's own logprobs serve (same module, same weights; `logprob_mismatch` shows the gap),
            # and another engine's are recomputed by the trainer (verl's old_log_prob stage).
            # Asynchronous rollouts were sampled by older weights: the update's own start is recomputed too.
            on_policy = a.epochs == 1 and a.minibatches == 1
            recompute = not on_policy and (self.separate_engine or cfg.rollout.mode == "async")
            need_values = self.value_head is not None
            old_logp: torch.Tensor | None = None if on_policy else batch.rollout_logprobs
            values = None
            ref_logp = None
            with torch.no_grad():
                if recompute or need_values:
                    logp_now, _, hidden = forward(self.model, batch, temperature, hidden=need_values,
                                                  share_prefix=self.share_prefix)
                    if recompute:
                        old_logp = logp_now
                    if need_values:
                        values = self.value_head(hidden)  # type: ignore[misc]
                if self.ref_model is not None:
                    ref_logp, _, _ = forward(self.ref_model, batch, temperature, share_prefix=self.share_prefix)
        with timer("advantages"):
            kl_reward = None
            if ref_logp is not None and a.kl_in_reward:
                behaviour = old_logp if old_logp is not None else batch.rollout_logprobs
                kl_reward = algos.kl_estimate(behaviour, ref_logp, a.kl_estimator)
            reduce = dist.all_reduce_sum if self.world > 1 else None
            if a.credit == "outcome":
                token_rewards = algos.outcome_token_rewards(batch.rewards, mask, kl_reward, a.kl_coef)
                advantages, returns = algos.compute_advantages(
                    a.name, token_rewards, mask, batch.group_ids, values=values, std_normalize=a.std_normalize,
                    gamma=a.gamma, lam=a.lam, whiten=a.whiten_advantages, reduce=reduce)
            else:
                turns = turn_layout(trajectories, batch.rewards, mask.shape[1], kl_reward, a.kl_coef)
                advantages, returns = algos.compute_turn_advantages(
                    a.credit, turns.rewards, turns.mask, turns.turn_of, mask, batch.group_ids, states=turns.states,
                    values=values, gamma=a.gamma, lam=a.lam, step_weight=a.step_weight,
                    whiten=a.whiten_advantages, reduce=reduce)
        # Thread counts are process-wide: in async mode the producer's core is not the update's to take.
        with timer("update"), _torch_threads(cfg.update_threads if cfg.rollout.mode == "sync" else 0):
            metrics |= self._optimise(batch, old_logp, ref_logp, advantages, values, returns, placeholder)
        return metrics

    def _optimise(self, batch: Batch, old_logp: torch.Tensor | None, ref_logp: torch.Tensor | None,
                  advantages: torch.Tensor, values: torch.Tensor | None, returns: torch.Tensor | None,
                  placeholder: bool = False) -> dict[str, float]:
        """Epochs x minibatches of optimizer steps. Each minibatch is run as length-sorted micro-batches
        whose gradients accumulate, each padded only to its own longest row; every loss term is weighted by
        its micro-batch's share of the minibatch's aggregation denominator, so the gradient is the one of
        the whole minibatch at once. Across ranks the denominators are the whole batch's (summed over ranks,
        divided by the world size, since DDP and DeepSpeed average the ranks' gradients): the N-rank
        gradient is the one-process gradient, whatever each rank's share of tokens or sequences."""
        a = self.config.algorithm
        agg = a.resolved_loss_agg
        self.model.train()
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}
        maxima: dict[str, float] = {}
        gen = torch.Generator().manual_seed(self.config.seed * 7_919 + self.step)
        lengths = batch.attention_mask.sum(-1).cpu()
        first = True
        for _ in range(a.epochs):
            order = torch.randperm(batch.size, generator=gen) if a.minibatches > 1 else torch.arange(batch.size)
            # tensor_split: always `minibatches` chunks, so every rank makes the same number of steps.
            for rows in torch.tensor_split(order, a.minibatches):
                empty = rows.numel() == 0  # fewer rows than minibatches here: a placeholder row, mask 0
                rows = order[:1] if empty else rows[torch.argsort(lengths[rows], stable=True)]
                mb_mask = batch.mask.index_select(0, rows.to(self.device))
                if empty:
                    mb_mask = torch.zeros_like(mb_mask)
                # A placeholder row counts in no denominator (not even as a row of seq-mean-token-sum-norm).
                rows_counted = 0.0 if empty or placeholder else agg_denominator(mb_mask, agg, minimum=0.0)
                local = torch.tensor([rows_counted, float(mb_mask.sum())], dtype=torch.float64)
                total = dist.all_reduce_sum(local).tolist()
                denominator = max(total[0], 1.0) / self.world
                tokens_total = max(total[1], 1.0) / self.world
                parts: dict[str, float] = {}
                self.update.zero_grad()
                micro = rows.split(self.update.micro_batch_size or batch.size)
                for i, cpu_idx in enumerate(micro):
                    idx = cpu_idx.to(self.device)
                    width = int(lengths[cpu_idx].max())
                    mb = trim(batch.rows(idx), width)
                    if empty:
                        mb = dataclasses.replace(mb, mask=torch.zeros_like(mb.mask))

                    def cut(t: torch.Tensor, idx: torch.Tensor = idx, width: int = width) -> torch.Tensor:
                        return t.index_select(0, idx)[:, : width - 1]

                    micro_batch = MicroBatch(
                        batch=mb, old_logp=None if old_logp is None else cut(old_logp), advantages=cut(advantages),
                        ref_logp=None if ref_logp is None else cut(ref_logp),
                        values=None if values is None else cut(values),
                        returns=None if returns is None else cut(returns),
                        weight=agg_denominator(mb.mask, agg) / denominator,  # its share of the minibatch's mean
                        token_weight=float(mb.mask.sum()) / tokens_total,  # its share of the tokens
                        measure_mismatch=first)
                    with self.update.accumulating(last=i == len(micro) - 1):
                        loss, terms = self.micro_step(micro_batch)
                        self.update.backward(loss)
                    for k, v in terms.items():  # "_max" terms are maxima, the rest weighted sums
                        parts[k] = max(parts.get(k, v), v) if k.endswith("_max") else parts.get(k, 0.0) + v
                first = False
                parts = _reduce_metrics(parts)
                parts["grad_norm"] = self.update.step()
                for k, v in parts.items():
                    if k.endswith("_max"):
                        maxima[k] = max(maxima.get(k, v), v)
                    sums[k] = sums.get(k, 0.0) + v
                    counts[k] = counts.get(k, 0) + 1
        self.scheduler.step()
        self.model.eval()
        return {k: maxima[k] if k in maxima else sums[k] / counts[k] for k in sums}

    def micro_step(self, micro: MicroBatch) -> tuple[torch.Tensor, dict[str, float]]:
        """The weighted loss of one micro-batch (policy, KL, entropy, value terms) and its weighted metrics;
        summed over a minibatch's micro-batches they are the minibatch's loss and metrics."""
        cfg, a = self.config, self.config.algorithm
        agg = a.resolved_loss_agg
        norm_length = cfg.rollout.max_new_tokens * cfg.rollout.max_turns
        mb, mask, w, w_tok = micro.batch, micro.batch.mask, micro.weight, micro.token_weight
        # Through the update's module (DDP or DeepSpeed when they wrap it): that is what syncs the gradients.
        # Under N ranks, the common prefix only (per_group=False): DDP syncs buffers in every forward call, a
        # collective, and the group and bucket passes follow each rank's own rows, so ranks would make
        # different calls and wait on each other for ever.
        logp, entropy, hidden = forward(self.update.module, mb, cfg.rollout.temperature, entropy=True,
                                        hidden=self.value_head is not None, share_prefix=self.share_prefix,
                                        per_group=self.world == 1)
        terms: dict[str, float] = {}
        if micro.measure_mismatch:
            # Same tokens, same weights: any gap is engine/trainer numerics (or a bug).
            gap = (logp.detach() - mb.rollout_logprobs).abs()
            terms["logprob_mismatch"] = w_tok * float(algos.masked_mean(gap, mask))
        old = logp.detach() if micro.old_logp is None else micro.old_logp
        # The engine's logprobs are the behaviour policy's; weigh each token by pi_old / pi_behaviour.
        correction = a.resolved_off_policy_correction(cfg.rollout.mode)
        is_w, im = algos.off_policy_weights(correction, old, mb.rollout_logprobs, mask,
                                            cap=a.tis_cap, band=(a.mis_band[0], a.mis_band[1]))
        loss, pm = algos.clipped_policy_loss(
            logp, old, micro.advantages, mask, clip_low=a.clip_low, clip_high=a.resolved_clip_high,
            dual_clip=a.dual_clip, agg=agg, norm_length=norm_length, is_weights=is_w)  # type: ignore[arg-type]
        total = w * loss
        terms |= {"loss/policy": w * loss.item(), **{k: w_tok * v.item() for k, v in pm.items()}}
        terms |= {k: v.item() if k.endswith("_max") else w_tok * v.item() for k, v in im.items()}
        if micro.ref_logp is not None:
            kl = algos.kl_estimate(logp, micro.ref_logp, a.kl_estimator)
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
            assert micro.values is not None and micro.returns is not None and hidden is not None
            vloss, vm = algos.clipped_value_loss(self.value_head(hidden), micro.values, micro.returns, mask,
                                                 clip=a.value_clip)
            total = total + w_tok * a.vf_coef * vloss
            terms["loss/value"] = w_tok * vloss.item()
            terms |= {k: w_tok * v.item() for k, v in vm.items()}
        terms["loss/total"] = total.item()
        return total, terms

    def evaluate(self) -> dict[str, float]:
        """Held-out pass@1 (greedy), mean turns, tool-error rate and, when ``eval.pass_k`` asks for it, sampled
        pass@k (``trainer.evaluation``); on rank 0 only (the other ranks get ``{}`` and go on to the next step)."""
        if not self.main:
            return {}
        with self.producer.paused() if self.producer is not None and self._shares_pools() else contextlib.nullcontext():
            metrics, _ = evaluate(self._eval_agent(), self.eval_samples, self.config.eval.max_new_tokens,
                                  self.config.eval.batch_size, sampled_eval(self.config))
        return metrics

    def _shares_pools(self) -> bool:
        """Async mode with resource pools: evaluations use the producer's pools, with the producer paused."""
        return self._producer_agent is not None and pools_of(self._producer_agent) is not None

    def _eval_agent(self) -> Agent:
        """The agent evaluations run on: the trainer's own, except while an asynchronous producer runs and
        either has resource pools or drives a separate engine. With pools, it is an agent on the producer's
        pools and event loop (``evaluate`` pauses the producer meanwhile), so that a pool never holds more
        than its ``max`` instances. Its engine holds the weights just trained: the trainer's own HF engine,
        or, when the producer drives a separate engine (vLLM) that no other thread may step, a new HF engine
        over the trainer's module. Built once."""
        if self.producer is None or self._producer_agent is None or not (self.separate_engine or self._shares_pools()):
            return self.agent
        if self._async_eval_agent is None:
            from agentfly.engines.hf import HFEngine

            engine = HFEngine(model=self.model, tokenizer=self.tokenizer) if self.separate_engine else self.engine
            if self._shares_pools():
                agent = build_agent(self.config, engine, resources=pools_of(self._producer_agent))
                agent.share_loop(self._producer_agent)
            else:
                agent = build_agent(self.config, engine)
            self._async_eval_agent = agent
        return self._async_eval_agent

    # -------------------------------------------------------------------------------------- the run
    def _start_producer(self) -> RolloutProducer:
        """rollout.mode=async: a producer thread with its own engine, agent (and resource pools) and data
        cursor, starting at this step with the weights of this version. With ``engine: hf`` the engine is a
        new HF engine on a copy of the policy; a separate engine (vLLM) already holds its own copy of the
        weights, so the producer takes it over: from here on only the producer's thread drives it and loads
        new weights into it (``load_weights`` between two batches), and the trainer evaluates on an HF
        engine over its own module (``_eval_agent``)."""
        from agentfly.engines.hf import HFEngine

        group = dist.side_group()  # every rank makes it here, at the same point
        if self.separate_engine:
            engine: Engine = self.engine
        else:
            model = copy.deepcopy(self.model).eval().requires_grad_(False)
            engine = HFEngine(model=model, tokenizer=self.tokenizer)
        agent = build_agent(self.config, engine)
        self._producer_engine = engine
        self._producer_agent = agent
        self._producer_idle = 0.0
        cursor = DataCursor(self.cursor.samples, self.config.data.seed, self.config.data.shuffle)
        cursor.load_state_dict(self.cursor.state_dict())

        def collect(step: int, at: DataCursor) -> tuple[Collected, dict[str, float]]:
            timer = StageTimer()
            return self.collect(timer, agent=agent, cursor=at, step=step, group=group), timer.times

        return RolloutProducer(collect, engine.update_weights, cursor, step=self.step, version=self.step,
                               last_step=self.config.steps, max_staleness=self.config.rollout.max_staleness).start()

    def _stop_producer(self) -> None:
        """Stop the producer, then close its agent's and the evaluation agent's pools and event loops (each
        on the loop its instances belong to, idle once the producer's thread has ended)."""
        if self.producer is not None:
            self.producer.close()
            if self.producer.running:  # still in a batch past close's timeout: its loop is not ours to close
                return
        for agent in (self._producer_agent, self._async_eval_agent):
            if agent is not None:
                agent.close()

    def train(self, should_stop: Callable[[], bool] | None = None) -> dict[str, Any]:
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
            if cfg.rollout.mode == "async":
                self.producer = self._start_producer()
            while self.step < cfg.steps:
                # Decided together: a rank that stopped alone would leave the others waiting in a collective.
                stop, over = dist.all_reduce_max(torch.tensor([
                    float(should_stop is not None and should_stop()),
                    float(cfg.max_minutes is not None and time.perf_counter() - start > cfg.max_minutes * 60)],
                    dtype=torch.float64)).tolist()
                if stop:
                    state = "cancelled"
                    break
                if over:
                    self.events.log(self.step, f"time budget of {cfg.max_minutes} minutes reached")
                    break
                last = self.train_step()
                timer = StageTimer()
                due_eval = cfg.eval.every and self.step % cfg.eval.every == 0 and self.step < cfg.steps
                if due_eval:
                    with timer("eval"):
                        eval_metrics = self.evaluate()
                    if self.main:
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
            self._stop_producer()
            # Sandboxes and environments (kept warm across steps on run_sync's loop), then that loop; the
            # rollouts have all ended.
            self.agent.close()
            if self._owns_engine:
                # Now, not whenever the garbage collector gets to it: vLLM's teardown resets process-wide
                # state, and run in the middle of the next engine's start it breaks that one.
                self.engine.close()
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
        for _, key, fmt in self.COLUMNS:
            width = len(fmt.format(0.0))
            value = metrics.get(key)
            row.append(fmt.format(value) if isinstance(value, (int, float)) else f"{'-':>{width}}")
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
          should_stop: Callable[[], bool] | None = None) -> dict[str, Any]:
    """Train with ``config``, streaming events to ``sinks`` (plus ``<output_dir>/events.jsonl``); under a
    launcher this is one rank of the run, and the process group is left when it ends."""
    try:
        return Trainer(config, sinks=sinks, resume=resume).train(should_stop=should_stop)
    finally:
        if dist.world_size() > 1:
            dist.destroy_process_group()
