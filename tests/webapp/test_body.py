"""How the job body turns the trainer's event stream into progress and checkpoint rows (no Django needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from webapp.jobs.body import CheckpointWatcher, checkpoint_dir


def watcher(tmp_path: Path) -> tuple[CheckpointWatcher, list[Any], list[int]]:
    checkpoints: list[Any] = []
    steps: list[int] = []
    w = CheckpointWatcher(tmp_path, lambda step, path, metrics: checkpoints.append((step, path, metrics)),
                          steps.append)
    return w, checkpoints, steps


def test_a_timed_save_records_the_checkpoint_the_trainer_wrote(tmp_path: Path) -> None:
    w, checkpoints, steps = watcher(tmp_path)
    checkpoint_dir(tmp_path, 2).mkdir()
    w.emit({"type": "metrics", "step": 1, "data": {"reward/mean": 0.1}})
    w.emit({"type": "metrics", "step": 2, "data": {"reward/mean": 0.5}})
    w.emit({"type": "metrics", "step": 2, "data": {"time/checkpoint": 0.1}})
    w.emit({"type": "metrics", "step": 2, "data": {"time/checkpoint": 0.1}})  # recorded once
    assert steps == [1, 2]
    assert checkpoints == [(2, str(tmp_path / "checkpoint-000002"), {"reward/mean": 0.5})]


def test_a_save_whose_folder_is_gone_is_not_recorded(tmp_path: Path) -> None:
    w, checkpoints, _ = watcher(tmp_path)
    w.emit({"type": "metrics", "step": 3, "data": {"time/checkpoint": 0.1}})
    assert checkpoints == []


def test_an_event_that_names_its_checkpoint_is_recorded_at_that_path(tmp_path: Path) -> None:
    w, checkpoints, _ = watcher(tmp_path)
    elsewhere = tmp_path / "saved" / "step-4"
    elsewhere.mkdir(parents=True)
    w.emit({"type": "log", "step": 4, "data": {"message": "saved", "checkpoint": str(elsewhere)}})
    assert [(s, p) for s, p, _ in checkpoints] == [(4, str(elsewhere))]
