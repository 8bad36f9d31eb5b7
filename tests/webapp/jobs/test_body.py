"""How the job body turns the trainer's event stream into progress and checkpoint rows (no Django needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainer.events import CallbackSink, EventStream
from webapp.jobs.body import CheckpointWatcher


def watcher() -> tuple[CheckpointWatcher, list[Any], list[int]]:
    checkpoints: list[Any] = []
    steps: list[int] = []
    w = CheckpointWatcher(lambda step, path, metrics: checkpoints.append((step, path, metrics)), steps.append)
    return w, checkpoints, steps


def test_a_checkpoint_event_records_the_checkpoint_at_the_path_the_trainer_wrote(tmp_path: Path) -> None:
    w, checkpoints, steps = watcher()
    stream = EventStream([CallbackSink(w.emit)])
    saved = tmp_path / "saved" / "step-2"
    saved.mkdir(parents=True)
    stream.metrics(1, {"reward/mean": 0.1})
    stream.metrics(2, {"reward/mean": 0.5})
    stream.checkpoint(2, saved, score=None)
    stream.checkpoint(2, saved, score=None)  # recorded once
    assert steps == [1, 2]
    assert checkpoints == [(2, str(saved), {"reward/mean": 0.5})]


def test_metrics_that_time_a_save_no_longer_invent_a_checkpoint(tmp_path: Path) -> None:
    w, checkpoints, _ = watcher()
    (tmp_path / "checkpoint-000003").mkdir()
    EventStream([CallbackSink(w.emit)]).metrics(3, {"time/checkpoint": 0.1})
    assert checkpoints == []


def test_a_checkpoint_whose_folder_is_gone_is_not_recorded(tmp_path: Path) -> None:
    w, checkpoints, _ = watcher()
    EventStream([CallbackSink(w.emit)]).checkpoint(3, tmp_path / "pruned", score=0.5)
    assert checkpoints == []
