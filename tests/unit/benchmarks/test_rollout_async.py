"""``benchmarks/rollout_async.py``'s ideal: the least time any schedule could take, from hand-made timings."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "rollout_async.py"
spec = importlib.util.spec_from_file_location("rollout_async_under_test", SCRIPT)
assert spec and spec.loader
rollout_async = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rollout_async)


def test_the_ideal_waits_for_every_rollouts_first_turn_when_a_full_batch_decodes_slower_than_one_row() -> None:
    # 2 tool calls of 0.5 s. One rollout alone: 0.06 s, of which its first turn 0.02 s and two turns 0.04 s.
    # 32 rollouts together: first turns 0.10 s, two turns 0.20 s, all three 0.26 s. The last rollout to end
    # its first turn does so at 0.10 s at best, then waits 2 x 0.5 s and generates its 0.04 s alone.
    ideal = rollout_async.ideal_time(t_gen=0.26, t_one=0.06, head={1: 0.10, 2: 0.20}, head_one={1: 0.02, 2: 0.04},
                                     turns=2, latency=0.5)
    assert ideal == pytest.approx(0.10 + 1.0 + 0.04)


def test_the_ideal_is_the_critical_path_when_batching_is_free_and_all_generation_when_tools_are_instant() -> None:
    free = {1: 0.02, 2: 0.04}  # a step of N rows costs what a step of one does
    assert rollout_async.ideal_time(0.06, 0.06, free, free, turns=2, latency=0.5) == pytest.approx(1.06)
    assert rollout_async.ideal_time(0.9, 0.06, {1: 0.3, 2: 0.6}, free, turns=2, latency=0.0) == pytest.approx(0.9)
