"""Held-out evaluation: what ``agentfly eval`` reports and what the trainer's periodic eval logs.

    pass@1          greedy decoding, one rollout per problem: the share whose reward is full (>= 1)
    pass@k          n rollouts per problem at a temperature, scored with the unbiased estimator of Chen et
                    al. 2021 ("Evaluating Large Language Models Trained on Code", eq. 1), averaged over problems
    mean_turns      assistant turns per greedy trajectory
    tool_error_rate the share of the greedy trajectories' tool calls that failed: an unknown tool, arguments
                    that do not fit its schema, the tool raised, or a call that could not be parsed

Each figure is given for all problems and per task split (``group_by``): a field the samples carry (``split``,
``type``, ``task_type``, ``task``), or, when they carry none, the data they came from.

    agentfly eval runs/calculator/checkpoint-latest --k 1 4 --samples 8 --temperature 1.0 --json eval.json
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from agentfly.agents.agent import Agent
    from agentfly.rollout.trajectory import Trajectory
    from trainer.config import Config

# Fields that name a task's split, in the order they are tried.
SPLIT_FIELDS = ("split", "type", "task_type", "task")
FULL_REWARD = 1.0 - 1e-9


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate of pass@k from ``n`` samples of which ``c`` are correct (Chen et al. 2021):
    ``1 - C(n - c, k) / C(n, k)``, the chance that k of the n samples, drawn without replacement, hold at
    least one correct one. Computed as a product (as in the paper's code) so large n does not overflow."""
    if not 1 <= k <= n:
        raise ValueError(f"pass@{k} needs 1 <= k <= n samples per problem, got k={k}, n={n}; "
                         f"draw at least {k} samples (--samples)")
    if not 0 <= c <= n:
        raise ValueError(f"c={c} correct samples must be between 0 and n={n}")
    if n - c < k:  # every draw of k samples holds a correct one
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


@dataclass
class Sampled:
    """The pass@k part of an evaluation: ``n`` rollouts per problem at ``temperature``."""

    ks: list[int]
    n: int
    temperature: float
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.ks or min(self.ks) < 1:
            raise ValueError(f"pass@k needs k >= 1, got {self.ks}")
        if self.n < max(self.ks):
            raise ValueError(f"pass@{max(self.ks)} needs at least {max(self.ks)} samples per problem, got {self.n}")
        if self.temperature <= 0:
            raise ValueError(f"pass@k samples at a temperature > 0 (greedy samples are all alike), got "
                             f"{self.temperature}")


def sampled_eval(config: Config) -> Sampled | None:
    """The pass@k part that ``eval.pass_k`` asks for (None when it is empty: greedy figures only)."""
    e = config.eval
    if not e.pass_k:
        return None
    return Sampled(list(e.pass_k), e.samples or max(e.pass_k), e.temperature, seed=config.seed)


@dataclass
class EvalRun:
    """The rollouts of one evaluation: one greedy per problem, and ``sampled.n`` per problem when asked."""

    samples: list[dict[str, Any]]
    greedy: list[Trajectory]
    sampled: Sampled | None = None
    sampled_trajectories: list[Trajectory] = field(default_factory=list)  # n consecutive ones per problem

    def metrics(self, indices: Sequence[int] | None = None, prefix: str = "eval/") -> dict[str, float]:
        """Every figure over the problems at ``indices`` (all of them by default), keys under ``prefix``."""
        from trainer.metrics import rollout_metrics

        idx = list(range(len(self.samples))) if indices is None else list(indices)
        out = rollout_metrics([self.greedy[i] for i in idx], prefix)
        # A problem the infrastructure failed on (counted in rollout/infra_failed) says nothing of the agent.
        greedy = [self.greedy[i] for i in idx if not self.greedy[i].infra_failed]
        if not greedy:
            return out
        calls = sum(len(t.tool_calls) for t in greedy)
        out |= {
            f"{prefix}problems": float(len(greedy)),
            f"{prefix}pass_at_1": float(np.mean([t.reward >= FULL_REWARD for t in greedy])),
            f"{prefix}mean_turns": float(np.mean([t.num_turns for t in greedy])),
            # A rate over calls, not trajectories; no call at all is no failed call.
            f"{prefix}tool_error_rate": sum(t.tool_errors for t in greedy) / calls if calls else 0.0,
        }
        if self.sampled is not None:
            n = self.sampled.n
            correct = [sum(t.reward >= FULL_REWARD for t in self.sampled_trajectories[i * n:(i + 1) * n])
                       for i in idx]
            for k in self.sampled.ks:
                out[f"{prefix}sampled/pass_at_{k}"] = float(np.mean([pass_at_k(n, c, k) for c in correct]))
            out[f"{prefix}sampled/n"] = float(n)
            out[f"{prefix}sampled/temperature"] = self.sampled.temperature
        return out


def run_eval(agent: Agent, samples: Sequence[dict[str, Any]], max_new_tokens: int, batch_size: int = 500,
             sampled: Sampled | None = None) -> EvalRun:
    """Roll the agent out on ``samples``: greedily once each, and ``sampled.n`` times each when given.
    ``batch_size`` rollouts are given to the agent at once; it starts no more than its pools hold."""
    import agentfly as af

    samples = list(samples)
    greedy: list[Trajectory] = []
    sampling = af.Sampling(temperature=0.0, max_new_tokens=max_new_tokens)
    for start in range(0, len(samples), batch_size):
        greedy += agent.run_sync(samples[start:start + batch_size], group_size=1, sampling=sampling)
    run = EvalRun(samples, greedy, sampled)
    if sampled is not None:
        hot = af.Sampling(temperature=sampled.temperature, max_new_tokens=max_new_tokens, seed=sampled.seed)
        per_batch = max(1, batch_size // sampled.n)  # whole problems per batch: their n rollouts stay together
        for start in range(0, len(samples), per_batch):
            run.sampled_trajectories += agent.run_sync(samples[start:start + per_batch], group_size=sampled.n,
                                                       sampling=hot, first_index=start * sampled.n)
    return run


def evaluate(agent: Agent, samples: Sequence[dict[str, Any]], max_new_tokens: int, batch_size: int = 500,
             sampled: Sampled | None = None) -> tuple[dict[str, float], list[Trajectory]]:
    """The figures over all ``samples`` (``eval/...``) and the greedy trajectories."""
    run = run_eval(agent, samples, max_new_tokens, batch_size, sampled)
    return run.metrics(), run.greedy


def split_field(samples: Sequence[dict[str, Any]]) -> str | None:
    """The field that splits the samples into task splits: the first of ``SPLIT_FIELDS`` that every sample
    carries and that takes several values, else the first that every sample carries, else None."""
    carried = [f for f in SPLIT_FIELDS if samples and all(f in s for s in samples)]
    several = [f for f in carried if len({str(s[f]) for s in samples}) > 1]
    chosen = several or carried
    return chosen[0] if chosen else None


def group_indices(samples: Sequence[dict[str, Any]], by: str | None, source: str) -> dict[str, list[int]]:
    """Problem indices per split: by the value of field ``by``, or all under ``source`` when ``by`` is None."""
    if by is None:
        return {source: list(range(len(samples)))}
    missing = [i for i, s in enumerate(samples) if by not in s]
    if missing:
        raise ValueError(f"--group-by {by}: {len(missing)} of {len(samples)} samples have no {by!r} field "
                         f"(the first has {sorted(samples[missing[0]])}); pick a field they all carry")
    groups: dict[str, list[int]] = {}
    for i, s in enumerate(samples):
        groups.setdefault(str(s[by]), []).append(i)
    return dict(sorted(groups.items()))


def report(run: EvalRun, by: str | None, source: str) -> dict[str, Any]:
    """The JSON report: the figures for all problems and per split, and how the splits were made."""
    groups = group_indices(run.samples, by, source)
    return {
        "group_by": f"field {by!r}" if by else f"data source (the samples carry none of {', '.join(SPLIT_FIELDS)})",
        "all": run.metrics(),
        "splits": {name: run.metrics(idx) for name, idx in groups.items()},
    }


def table(rep: dict[str, Any]) -> str:
    """The report as a fixed-width text table: one row for all problems, then one per split."""
    first = rep["all"]
    cols: list[tuple[str, str, str]] = [("problems", "eval/problems", "{:.0f}"),
                                        ("pass@1 (greedy)", "eval/pass_at_1", "{:.3f}")]
    if "eval/sampled/n" in first:
        label = f"(n={first['eval/sampled/n']:.0f}, T={first['eval/sampled/temperature']:g})"
        cols += [(f"pass@{key.rsplit('_', 1)[1]} {label}", key, "{:.3f}")
                 for key in first if key.startswith("eval/sampled/pass_at_")]
    cols += [("mean turns", "eval/mean_turns", "{:.2f}"), ("tool-error rate", "eval/tool_error_rate", "{:.3f}")]
    # A split whose every problem failed for the infrastructure has no figures of the agent: "-".
    rows = [["all", *(fmt.format(first[key]) if key in first else "-" for _, key, fmt in cols)]]
    rows += [[name, *(fmt.format(m[key]) if key in m else "-" for _, key, fmt in cols)]
             for name, m in rep["splits"].items()]
    header = ["split", *(name for name, _, _ in cols)]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
             for r in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join([*lines, f"splits by {rep['group_by']}"])
