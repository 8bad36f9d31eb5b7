"""The training process of a job: what runs inside the team's sandbox (``webapp.jobs.isolation``).

    python -P -m webapp.jobs.child run  --spec-fd SPEC --messages FD    # the job: body.run, events to FD
    python -P -m webapp.jobs.child node --spec-fd SPEC --messages FD    # node > 0 of a multi-node job
    python -P -m webapp.jobs.child rank TRAIN.yaml ...                  # one torchrun rank (trainer.cli train)

``SPEC`` is a descriptor the worker opened (an in-memory file: the config, the job's folder and how to run
it), never a file in the job's folder, where a job could have put a link for the worker to follow.

It holds no secret and reaches no database: it imports the team's code, trains with ``webapp.jobs.body``
(which imports neither Django nor its settings), and writes one JSON line per message to the pipe ``FD``:
``event`` (a trainer event), ``progress``, ``checkpoint``, then ``outcome`` or ``error``. Every message names
the job it was started for; the worker checks each one before it stores it. Cancel and yielding reach it as
the ``STOP`` file in its folder, checked between steps.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import traceback
from pathlib import Path
from typing import Any, BinaryIO


class Messages:
    """One JSON line per message on the worker's pipe; a lock keeps lines whole across threads."""

    def __init__(self, out: BinaryIO, job_id: int) -> None:
        self.out, self.job_id = out, job_id
        self._lock = threading.Lock()

    def send(self, kind: str, **fields: Any) -> None:
        line = json.dumps({"job": self.job_id, "kind": kind, **fields}, default=_plain) + "\n"
        with self._lock:
            self.out.write(line.encode())
            self.out.flush()

    # The sink interface (trainer.events.Sink): the trainer's events go to the worker as they are.
    def emit(self, event: Any) -> None:
        self.send("event", event=event)

    def close(self) -> None:
        pass


def _plain(value: Any) -> Any:
    if hasattr(value, "item") and callable(value.item):  # numpy / torch scalars
        return value.item()
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return str(value)


def add_plugins() -> None:
    """Make the plugin folders the sandbox shows importable, as a worker does (``AGENTFLY_PLUGIN_DIRS``)."""
    from webapp.registry.introspect import add_plugin_dirs

    dirs = [d for d in os.environ.get("AGENTFLY_PLUGIN_DIRS", "").split(",") if d]
    add_plugin_dirs([d for d in dirs if Path(d).is_dir()])


def run(spec: dict[str, Any], messages: Messages) -> int:
    from webapp.jobs import body

    output_dir = Path(spec["output_dir"])
    stop = output_dir / "STOP"
    node = body.Node(*spec["node"]) if spec.get("node") else None
    try:
        outcome = body.run(
            spec["config"], kind=spec["kind"], ranks=spec["ranks"], resume_from=spec["resume_from"],
            output_dir=output_dir, sinks=[messages], node=node,
            should_stop=stop.exists,
            on_checkpoint=lambda step, path, metrics: messages.send("checkpoint", step=step, path=path,
                                                                    metrics=metrics),
            on_step=lambda step: messages.send("progress", step=step),
        )
    except BaseException as exc:
        messages.send("error", error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
        return 1
    messages.send("outcome", cancelled=outcome.cancelled, final_metrics=outcome.final_metrics,
                  last_step=outcome.last_step)
    return 0


def run_node(spec: dict[str, Any]) -> int:
    from webapp.jobs import body

    output_dir = Path(spec["output_dir"])
    node = body.Node(*spec["node"])
    ended = output_dir / f"ENDED-node-{node.rank}"
    return body.run_node(spec["config"], ranks=spec["ranks"], resume_from=spec["resume_from"],
                         output_dir=output_dir, node=node, job_ended=ended.exists)


def main(argv: list[str]) -> int:
    mode, rest = argv[0], argv[1:]
    add_plugins()
    if mode == "rank":  # a torchrun rank: the trainer's own command line, with the team's code importable
        from trainer.cli import main as trainer_main

        return trainer_main(rest)
    with os.fdopen(int(rest[rest.index("--spec-fd") + 1]), "rb") as spec_file:
        spec = json.loads(spec_file.read())
    fd = int(rest[rest.index("--messages") + 1])
    with os.fdopen(fd, "wb", buffering=0) as out:
        if mode == "run":
            return run(spec, Messages(out, int(spec["job"])))
        if mode == "node":
            return run_node(spec)
    raise SystemExit(f"unknown mode {mode!r}; use run, node or rank")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
