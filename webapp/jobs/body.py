"""What a job runs on the worker: ``trainer.train`` with the job's sinks, cancel flag and checkpoint hook.

The trainer knows nothing of Django. It streams events (``{"type", "step", "time", "run", "data"}``) to the
sinks it is given and checks ``should_stop`` between steps. ``CheckpointWatcher`` is one more sink that
turns the trainer's events into job progress and ``Checkpoint`` rows. Everything here imports the trainer
(and torch) lazily, inside ``run``: the web process never calls it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol


class Sink(Protocol):
    def emit(self, event: dict[str, Any]) -> None: ...
    def close(self) -> None: ...


@dataclass
class Outcome:
    cancelled: bool = False
    final_metrics: dict[str, Any] = field(default_factory=dict)
    last_step: int = 0


OnCheckpoint = Callable[[int, str, dict[str, Any]], None]
OnStep = Callable[[int], None]


def checkpoint_dir(output_dir: Path, step: int) -> Path:
    """Where ``trainer.checkpoint.save_checkpoint`` puts the checkpoint of ``step``."""
    return output_dir / f"checkpoint-{step:06d}"


class CheckpointWatcher:
    """A sink that reports progress (each step's metrics) and checkpoints (the trainer times every save as
    ``time/checkpoint`` in that step's metrics) to the job, so the trainer needs no web-app hook."""

    def __init__(self, output_dir: Path, on_checkpoint: OnCheckpoint, on_step: OnStep) -> None:
        self.output_dir = output_dir
        self.on_checkpoint, self.on_step = on_checkpoint, on_step
        self.last_step = 0
        self.last_metrics: dict[str, Any] = {}
        self.recorded: set[int] = set()

    def emit(self, event: dict[str, Any]) -> None:
        step = event.get("step")
        data = event.get("data") or {}
        if not isinstance(step, int):
            return
        if isinstance(data.get("checkpoint"), str):  # a trainer that names its checkpoints says so directly
            self.checkpoint(step, Path(data["checkpoint"]))
            return
        if event.get("type") != "metrics":
            return
        if step > self.last_step:
            self.last_step = step
            self.on_step(step)
        if "time/checkpoint" in data:
            self.checkpoint(step)
        else:
            self.last_metrics.update(data)

    def checkpoint(self, step: int, path: Path | None = None) -> None:
        path = path or checkpoint_dir(self.output_dir, step)
        if step not in self.recorded and path.is_dir():
            self.recorded.add(step)
            self.on_checkpoint(step, str(path), dict(self.last_metrics))

    def close(self) -> None:
        pass


def trainer_config(config: dict[str, Any], output_dir: Path) -> Any:
    """The job's stored config as a validated ``trainer.config.Config`` writing into ``output_dir``."""
    from trainer.config import Config, from_dict
    from webapp.jobs.forms import trainer_takes_resources

    dropped = ("resume_from",) if trainer_takes_resources() else ("resources", "resume_from")
    data = {k: v for k, v in config.items() if k not in dropped}
    data["output_dir"] = str(output_dir)
    return from_dict(Config, data).validate()


def run(config: dict[str, Any], *, output_dir: Path, sinks: Sequence[Sink], should_stop: Callable[[], bool],
        on_checkpoint: OnCheckpoint, on_step: OnStep) -> Outcome:
    """Train as ``config`` says until done or ``should_stop()``; resume from ``config["resume_from"]``."""
    from trainer import train

    watcher = CheckpointWatcher(output_dir, on_checkpoint, on_step)
    result = train(trainer_config(config, output_dir), sinks=[*sinks, watcher],
                   resume=config.get("resume_from") or None, should_stop=should_stop)
    step = int(result.get("step", watcher.last_step))
    watcher.checkpoint(step)  # the final save (the trainer always saves at the end, cancelled or not)
    return Outcome(cancelled=result.get("state") == "cancelled", final_metrics=dict(result.get("metrics") or {}),
                   last_step=step)
