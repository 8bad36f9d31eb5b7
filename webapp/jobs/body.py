"""What a job runs on the worker: ``trainer.train`` with the job's sinks, cancel flag and checkpoint hook.

The trainer knows nothing of Django. It streams typed events (``trainer.events.Event``) to the sinks it is
given and checks ``should_stop`` between steps. ``CheckpointWatcher`` is one more sink that turns the
trainer's ``metrics`` events into job progress and its ``checkpoint`` events (one per save, with the path)
into ``Checkpoint`` rows. Everything here imports the trainer (and torch) lazily, inside ``run``: the web
process never calls it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainer.config import Config
    from trainer.events import Event, Sink


@dataclass
class Outcome:
    cancelled: bool = False
    final_metrics: dict[str, Any] = field(default_factory=dict)
    last_step: int = 0


OnCheckpoint = Callable[[int, str, dict[str, Any]], None]
OnStep = Callable[[int], None]


class CheckpointWatcher:
    """A sink that reports progress (each step's metrics) and checkpoints (the trainer's ``checkpoint``
    events) to the job, so the trainer needs no web-app hook."""

    def __init__(self, on_checkpoint: OnCheckpoint, on_step: OnStep) -> None:
        self.on_checkpoint, self.on_step = on_checkpoint, on_step
        self.last_step = 0
        self.last_metrics: dict[str, Any] = {}
        self.recorded: set[str] = set()

    def emit(self, event: Event) -> None:
        step, data = event["step"], event["data"]
        if event["type"] == "checkpoint":
            path = Path(data["path"])
            # A checkpoint pruned before this event was handled is not listed (its folder is gone).
            if data["path"] not in self.recorded and path.is_dir():
                self.recorded.add(data["path"])
                self.on_checkpoint(int(data["step"]), data["path"], dict(self.last_metrics))
        elif event["type"] == "metrics":
            if step > self.last_step:
                self.last_step = step
                self.on_step(step)
            self.last_metrics.update(data)

    def close(self) -> None:
        pass


def trainer_config(config: dict[str, Any], output_dir: Path) -> Config:
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

    watcher = CheckpointWatcher(on_checkpoint, on_step)
    result = train(trainer_config(config, output_dir), sinks=[*sinks, watcher],
                   resume=config.get("resume_from") or None, should_stop=should_stop)
    step = int(result.get("step", watcher.last_step))
    return Outcome(cancelled=result.get("state") == "cancelled", final_metrics=dict(result.get("metrics") or {}),
                   last_step=step)
