"""The asynchronous rollout producer on hand-built batches: its staleness gate, version tagging, dropping of
stale batches, the weights it swaps in, and the state a checkpoint records of it; and the settings of
``rollout.mode=async`` that cannot work are refused with the fix named."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

import pytest

from agentfly.rollout.trajectory import Trajectory
from trainer.builders import DataCursor
from trainer.collect import Collected
from trainer.config import ConfigError, load_config
from trainer.producer import ProducedBatch, RolloutProducer, too_stale

SAMPLES = [{"question": f"q{i}"} for i in range(40)]


class Recorder:
    """A collect function: draws 2 prompts, returns one trajectory per prompt, and records which weights
    (the last loaded ``step`` marker) sampled each step."""

    def __init__(self) -> None:
        self.weights: dict[str, Any] = {"marker": 0}
        self.sampled_with: dict[int, int] = {}
        self.calls = threading.Semaphore(0)

    def collect(self, step: int, cursor: DataCursor) -> tuple[Collected, dict[str, float]]:
        samples = cursor.take(2)
        self.sampled_with[step] = self.weights["marker"]
        trajectories = [
            Trajectory(sample=s, rollout_id=f"{step}-{i}", group_id=str(step)) for i, s in enumerate(samples)
        ]
        self.calls.release()
        return Collected(trajectories, trajectories, [0.0] * 2, [0] * 2), {"rollout": 0.01}

    def load(self, state: Mapping[str, Any]) -> None:
        self.weights = dict(state)


def producer(
    rec: Recorder, *, step: int = 0, last_step: int = 10, k: int = 1, cursor: DataCursor | None = None
) -> RolloutProducer:
    return RolloutProducer(
        rec.collect,
        rec.load,
        cursor or DataCursor(SAMPLES, seed=0),
        step=step,
        version=step,
        last_step=last_step,
        max_staleness=k,
    )


def test_a_batch_more_than_max_staleness_versions_old_is_too_stale():
    assert not too_stale(batch_version=3, version=3, max_staleness=1)
    assert not too_stale(batch_version=2, version=3, max_staleness=1)
    assert too_stale(batch_version=1, version=3, max_staleness=1)
    assert not too_stale(batch_version=1, version=3, max_staleness=2)


def test_the_producer_runs_at_most_max_staleness_steps_ahead_until_new_weights_are_published():
    rec = Recorder()
    p = producer(rec, k=1).start()
    try:
        for _ in range(2):  # steps 0 and 1 need version >= -1 and >= 0: both go with the starting weights
            assert rec.calls.acquire(timeout=10)
        assert not rec.calls.acquire(timeout=0.3)  # step 2 needs version 1
        first, dropped = p.get(version=0)
        assert (first.step, first.version, dropped) == (0, 0, 0)
        assert all(t.policy_version == 0 for t in first.collected.everything)  # every trajectory is tagged
        p.publish({"marker": 1}, version=1)
        assert rec.calls.acquire(timeout=10)
        second, third = p.get(version=1)[0], p.get(version=2)[0]
        assert (second.step, second.version) == (1, 0)  # sampled while update 0 ran: one version behind
        assert (third.step, third.version) == (2, 1)
        assert rec.sampled_with[2] == 1  # the published weights were swapped in before step 2 was sampled
        assert all(t.policy_version == 1 for t in third.collected.trajectories)
        assert p.idle_seconds > 0.2  # it waited for those weights
    finally:
        p.close()


def test_get_drops_and_counts_batches_older_than_max_staleness():
    rec = Recorder()
    p = producer(rec, k=1, last_step=3).start()
    try:
        assert rec.calls.acquire(timeout=10) and rec.calls.acquire(timeout=10)
        p.publish({"marker": 1}, version=1)
        assert rec.calls.acquire(timeout=10)
        # A trainer at version 2 may not train steps 0 (version 0: 2 behind) or 1 (version 0); step 2 (v1) goes.
        batch, dropped = p.get(version=2)
        assert (batch.step, dropped, p.dropped) == (2, 2, 2)
    finally:
        p.close()


def test_the_producer_stops_at_the_last_step_and_a_trainer_waiting_beyond_it_is_told():
    rec = Recorder()
    p = producer(rec, step=0, last_step=1, k=1).start()
    assert p.get(version=0)[0].step == 0
    with pytest.raises(RuntimeError, match="ended before the trainer's last step"):
        p.get(version=1)
    p.close()


def test_a_failing_collect_is_raised_in_the_trainers_thread():
    def boom(step: int, cursor: DataCursor) -> tuple[Collected, dict[str, float]]:
        raise ValueError("the reward crashed")

    p = RolloutProducer(
        boom, lambda s: None, DataCursor(SAMPLES, 0), step=0, version=0, last_step=5, max_staleness=1
    ).start()
    with pytest.raises(RuntimeError, match="the rollout producer failed: ValueError: the reward crashed"):
        p.get(version=0)
    p.close()


def test_the_producers_state_round_trips_and_a_resumed_cursor_draws_the_next_untrained_prompts():
    rec = Recorder()
    p = producer(rec, k=2).start()
    try:
        trained = p.get(version=0)[0]  # the trainer trains step 0; the producer has gone on ahead
        deadline = time.monotonic() + 10
        while p.state_dict()["next_step"] < 3 and time.monotonic() < deadline:  # steps 0-2 need version 0
            time.sleep(0.01)
        state = p.state_dict()
    finally:
        p.close()
    assert state["next_step"] == 3 and state["version"] == 0 and state["dropped"] == 0
    assert state["cursor"] == {"epoch": 0, "position": 6}  # 3 batches of 2 prompts drawn
    assert trained.cursor == {"epoch": 0, "position": 2}
    # Resume: a new producer from the trained cursor samples step 1's prompts again, as the first run did.
    first_run = DataCursor(SAMPLES, seed=0)
    first_run.take(2)
    expected_step_1 = first_run.take(2)
    cursor = DataCursor(SAMPLES, seed=0)
    cursor.load_state_dict(trained.cursor)
    again = producer(Recorder(), step=1, cursor=cursor).start()
    try:
        batch: ProducedBatch = again.get(version=1)[0]
    finally:
        again.close()
    assert batch.step == 1
    assert [t.sample for t in batch.collected.trajectories] == expected_step_1


def test_async_settings_that_cannot_work_are_refused_with_the_fix_named():
    with pytest.raises(ConfigError, match=r"rollout.max_staleness=0 must be >= 1.*rollout.mode=sync"):
        load_config(None, ["rollout.mode=async", "rollout.max_staleness=0"])
    # vLLM is a producer's engine too: it holds its own copy of the weights, which the producer loads into.
    assert load_config(None, ["rollout.mode=async", "engine=vllm"]).engine == "vllm"


def test_the_off_policy_correction_is_tis_in_async_mode_unless_chosen():
    assert (
        load_config(None, ["rollout.mode=async"]).algorithm.resolved_off_policy_correction("async") == "tis"
    )
    assert load_config(None, []).algorithm.resolved_off_policy_correction("sync") == "none"
    chosen = load_config(None, ["rollout.mode=async", "algorithm.off_policy_correction=mis"])
    assert chosen.algorithm.resolved_off_policy_correction("async") == "mis"
