"""Stage timing and a step's metrics: the ``StageTimer`` every stage runs under, the reward and behaviour
statistics of a set of trajectories (the step's and an evaluation's), their reduction over ranks, and the
table the command line prints one row of per step.

Every metric is reported as the one-process value: per-rank numbers are exchanged as sums, counts and maxima
(``trainer.distributed``), so N ranks report what one process doing the whole batch would.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from trainer import distributed as dist

if TYPE_CHECKING:
    from agentfly.rollout.trajectory import Trajectory


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
            "reward_error": t.reward_error is not None,
            "finish": t.finish_reason, "failure": t.failure}


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
    counts |= {f"{prefix}rollout/infra_failure/{kind}": float(n) for kind, n in sorted(failures.items())}
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
        # A reward that raised scores 0: without this count a broken reward reads as a policy that never
        # answers right.
        f"{prefix}reward_errors/count": float(sum(bool(r.get("reward_error")) for r in rows)),
        f"{prefix}reward_errors/fraction": float(np.mean([bool(r.get("reward_error")) for r in rows])),
    }
    for reason in ("answer", "max_turns", "length", "error"):
        out[f"{prefix}finish/{reason}"] = float(np.mean([r["finish"] == reason for r in rows]))
    return out


def reduce_metrics(values: dict[str, float]) -> dict[str, float]:
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


def stage_times(times: dict[str, float], step_seconds: float) -> dict[str, float]:
    """``time/<stage>`` and ``time/step``: a step waits for its slowest rank, so each is the maximum over ranks."""
    names = sorted(times)
    slowest = dist.all_reduce_max(torch.tensor([times[k] for k in names] + [step_seconds],
                                               dtype=torch.float64)).tolist()
    out = {f"time/{k}": v for k, v in zip(names, slowest, strict=False)}
    out["time/step"] = slowest[-1]
    return out


def throughput(generated_tokens: int, rollout_seconds: float, cpu_start: float) -> dict[str, float]:
    """``tokens_per_second`` of the rollout stage over every rank's generated tokens, and ``time/step_cpu``:
    the processes' CPU seconds since ``cpu_start``, summed (on a shared machine, wall time alone hides how
    much was ours)."""
    tokens = float(dist.all_reduce_sum(torch.tensor(float(generated_tokens), dtype=torch.float64)))
    cpu = float(dist.all_reduce_sum(torch.tensor(time.process_time() - cpu_start, dtype=torch.float64)))
    return {"tokens_per_second": tokens / max(rollout_seconds, 1e-9), "time/step_cpu": cpu}


class Progress:
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
