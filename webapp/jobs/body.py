"""What a job runs on the worker: ``trainer.train`` with the job's sinks, cancel flag and checkpoint hook.

The trainer knows nothing of Django. It streams typed events (``trainer.events.Event``) to the sinks it is
given and checks ``should_stop`` between steps. ``CheckpointWatcher`` is one more sink that turns the
trainer's ``metrics`` events into job progress and its ``checkpoint`` events (one per save, with the path)
into ``Checkpoint`` rows. Everything here imports the trainer (and torch) lazily, inside ``run``: the web
process never calls it.

Tracking never switches itself off. The trainer disables a sink that raises, so the watcher never raises:
a failed database write is retried with backoff, and if it keeps failing the watcher stops the run and
``run`` raises ``TrackingError`` naming the error, so the job fails loudly instead of training on unseen.
"""

from __future__ import annotations

import logging
import time
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
log = logging.getLogger(__name__)


class TrackingError(RuntimeError):
    """Progress or checkpoint tracking could not store what the trainer reported, even after retries."""


class CheckpointWatcher:
    """A sink that reports progress (each step's metrics) and checkpoints (the trainer's ``checkpoint``
    events) to the job, so the trainer needs no web-app hook.

    A report that raises is retried ``attempts`` times with doubling waits from ``backoff`` seconds (a
    dropped connection, a locked SQLite file); one that still fails sets ``error``, which stops the run.
    """

    def __init__(self, on_checkpoint: OnCheckpoint, on_step: OnStep, *, attempts: int = 5,
                 backoff: float = 0.2) -> None:
        self.on_checkpoint, self.on_step = on_checkpoint, on_step
        self.attempts, self.backoff = attempts, backoff
        self.last_step = 0
        self.last_metrics: dict[str, Any] = {}
        self.recorded: set[str] = set()
        self.error: str | None = None

    def emit(self, event: Event) -> None:
        step, data = event["step"], event["data"]
        if event["type"] == "checkpoint":
            path = Path(data["path"])
            # A checkpoint pruned before this event was handled is not listed (its folder is gone).
            if data["path"] not in self.recorded and path.is_dir():
                self.recorded.add(data["path"])
                self._report(f"the checkpoint of step {data['step']}", self.on_checkpoint,
                             int(data["step"]), data["path"], dict(self.last_metrics))
        elif event["type"] == "metrics":
            if step > self.last_step:
                self.last_step = step
                self._report(f"the progress of step {step}", self.on_step, step)
            self.last_metrics.update(data)

    def _report(self, what: str, fn: Callable[..., None], *args: Any) -> None:
        for attempt in range(1, self.attempts + 1):
            try:
                fn(*args)
                return
            except Exception as exc:  # never raised on: the trainer would disable this sink for good
                if attempt == self.attempts:
                    self.error = self.error or (f"{what} could not be stored after {attempt} attempts: "
                                                f"{type(exc).__name__}: {exc}")
                    log.error("%s; stopping the run", self.error, exc_info=True)
                    return
                log.warning("storing %s failed (attempt %d of %d); retrying", what, attempt, self.attempts,
                            exc_info=True)
                time.sleep(self.backoff * 2 ** (attempt - 1))

    def close(self) -> None:
        pass


class Lent:
    """A sink lent to the trainer, which closes every sink it is given when it ends. The owner closes the
    real one itself after its own last event (the error log of a failed run), never before it."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink

    def emit(self, event: Event) -> None:
        self.sink.emit(event)

    def close(self) -> None:
        pass


def trainer_config(config: dict[str, Any], output_dir: Path) -> Config:
    """The job's stored config as a validated ``trainer.config.Config`` writing into ``output_dir``."""
    from trainer.config import Config, from_dict

    data = {k: v for k, v in config.items() if k != "resume_from"}
    data["output_dir"] = str(output_dir)
    return from_dict(Config, data).validate()


def run(config: dict[str, Any], *, output_dir: Path, sinks: Sequence[Sink], should_stop: Callable[[], bool],
        on_checkpoint: OnCheckpoint, on_step: OnStep) -> Outcome:
    """Train as ``config`` says until done or ``should_stop()``; resume from ``config["resume_from"]``.

    The caller keeps ownership of ``sinks`` (closes them). Raises ``TrackingError`` when progress or
    checkpoints could not be stored.
    """
    from trainer import train

    watcher = CheckpointWatcher(on_checkpoint, on_step)
    result = train(trainer_config(config, output_dir), sinks=[*map(Lent, sinks), watcher],
                   resume=config.get("resume_from") or None,
                   should_stop=lambda: watcher.error is not None or should_stop())
    if watcher.error is not None:
        raise TrackingError(watcher.error)
    step = int(result.get("step", watcher.last_step))
    return Outcome(cancelled=result.get("state") == "cancelled", final_metrics=dict(result.get("metrics") or {}),
                   last_step=step)
