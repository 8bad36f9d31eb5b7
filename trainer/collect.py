"""The rollout and reward stages of a step: sample ``group_size`` trajectories per prompt through an
``agentfly.Agent``, take out those the infrastructure ended, shape the rewards (outcome plus turn rewards,
DAPO's overlong penalty) and, with dynamic sampling, refill until the batch has enough informative groups.

The trainer runs them for its own step (``Trainer.collect``); in async mode the producer runs them ahead on
its own agent and data cursor (``trainer.producer``). Both get a ``Collected``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from trainer import algorithms as algos
from trainer import distributed as dist
from trainer.config import Config
from trainer.metrics import StageTimer

if TYPE_CHECKING:
    from agentfly.agents.agent import Agent
    from agentfly.rollout.trajectory import Trajectory
    from trainer.builders import DataCursor


@dataclass
class Collected:
    """What the rollout and reward stages of one step produced."""

    everything: list[Trajectory]  # every trajectory sampled (all rounds), for metrics and samples
    trajectories: list[Trajectory]  # the ones to train on
    rewards: list[float]  # their shaped rewards
    groups: list[int]  # their group ids
    metrics: dict[str, float] = field(default_factory=dict)


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


def sampling(config: Config, step: int, round_index: int) -> Any:
    """The sampling settings of one refill round of ``step``."""
    import agentfly as af

    r = config.rollout
    # A seed per (run seed, step, refill round): rollouts are reproducible, which resume relies on.
    seed = (config.seed * 1_000_003 + step * 101 + round_index) % (2**31)
    return af.Sampling(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                       max_new_tokens=r.max_new_tokens, seed=seed)


def shaped_rewards(config: Config, trajectories: Sequence[Trajectory]) -> list[float]:
    a = config.algorithm
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


def collect(config: Config, agent: Agent, cursor: DataCursor, timer: StageTimer, *, step: int,
            group: Any = None) -> Collected:
    """Rollouts for ``step``; with dynamic sampling, rounds of fresh prompts from ``cursor`` until the batch
    has ``prompts_per_step`` groups whose rewards differ (or ``max_sample_batches`` rounds were made).

    group: the process group of the cross-rank counts (the producer's side group; None: the default one).

    Across ranks every rank takes the same ``prompts_per_step`` prompts from the shared order and rolls
    out its own slice of them; a round's kept count and the stop are decided on the whole batch, and the
    batch is cut to the first ``prompts_per_step * group_size`` kept rows in the one-process order
    (round by round, rank by rank), so the N ranks train on exactly the rows one process would.
    """
    r, a = config.rollout, config.algorithm
    world, rank = dist.world_size(), dist.rank()
    share = r.prompts_per_step // world
    first = rank * share  # this rank's first prompt of the round
    kept: list[list[tuple[Trajectory, float, int]]] = []  # per round
    counts: list[list[int]] = []  # per round, per rank: rows kept
    everything: list[Trajectory] = []
    refill = a.resolved_dynamic_sampling or r.infra_failures == "drop_group"
    rounds = a.max_sample_batches if refill else 1
    n = r.prompts_per_step * r.group_size
    for round_index in range(rounds):
        samples = cursor.take(r.prompts_per_step)[first:first + share]
        with timer("rollout"):
            # Seeds follow the rollout's index in the whole round, so rank r samples its prompts as one
            # process doing every prompt would.
            trajectories = agent.run_sync(samples, group_size=r.group_size,
                                          sampling=sampling(config, step, round_index),
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
            shaped = shaped_rewards(config, trajectories)
            if a.resolved_dynamic_sampling and trajectories:
                keep = algos.informative_groups(torch.tensor(shaped), torch.tensor(groups)).tolist()
            else:
                keep = [True] * len(trajectories)
            kept.append([(t, s, g) for t, s, g, k in zip(trajectories, shaped, groups, keep, strict=True) if k])
            mine = torch.zeros(world, dtype=torch.float64)
            mine[rank] = len(kept[-1])
            counts.append([int(c) for c in dist.all_reduce_sum(mine, group).tolist()])
        if sum(map(sum, counts)) >= n:
            break
    rows: list[tuple[Trajectory, float, int]] = []
    before = 0  # kept rows ahead of this rank's, in the one-process order
    for round_rows, round_counts in zip(kept, counts, strict=True):
        ahead = before + sum(round_counts[:rank])
        rows += round_rows[: max(0, min(len(round_rows), n - ahead))]
        before += sum(round_counts)
    sampled = float(dist.all_reduce_sum(torch.tensor(float(len(everything)), dtype=torch.float64), group))
    extra = {"rollout/rounds": float(round_index + 1),
             "rollout/kept_fraction": sum(map(sum, counts)) / max(sampled, 1.0)}
    return Collected(everything, [t for t, _, _ in rows], [s for _, s, _ in rows], [g for _, _, g in rows], extra)
