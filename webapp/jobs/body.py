"""What a job runs on the worker: ``trainer.train`` with the job's sinks, cancel flag and checkpoint hook.

A job's kind picks the body: ``rl`` trains with ``trainer.train``; ``sft`` runs the supervised warm start
(``trainer.sft.run_sft``), whose saved model is the job's checkpoint; ``sft_then_rl`` runs the warm start,
then RL from the weights it saved, its steps (events, progress, checkpoints) counted on after the warm
start's so the job has one step axis. A resumed ``sft_then_rl`` job is in its RL phase: its config already
names the warm start's model and the RL checkpoint to resume from (``actions.do_resume_job``).

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

import contextlib
import json
import logging
import re
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

    data = {**config, "output_dir": str(output_dir)}
    # The dashboard's rollout viewer lists every trajectory of a step, fetched one step at a time.
    data.setdefault("log_samples", -1)
    return from_dict(Config, data)  # validated on construction


class Offset:
    """A sink that shifts each event's step by ``steps``: an sft_then_rl job's RL phase, counted on after its
    warm start, so its charts continue the warm start's instead of drawing over them."""

    def __init__(self, sink: Sink, steps: int) -> None:
        self.sink, self.steps = sink, steps

    def emit(self, event: Event) -> None:
        self.sink.emit({**event, "step": event["step"] + self.steps})

    def close(self) -> None:
        pass


class WarmStartPhase:
    """A sink for the warm start of an sft_then_rl job: its ``succeeded`` is the end of a phase, not of the
    job, so it is logged instead of sent as a status (the page would show the job finished)."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink

    def emit(self, event: Event) -> None:
        from trainer.events import log_event

        if event["type"] == "status" and event["data"]["state"] == "succeeded":
            event = log_event(event["step"], f"warm start done ({event['data']['message']}); RL starts from its "
                              "weights", run=event["run"], at=event["time"])
        self.sink.emit(event)

    def close(self) -> None:
        pass


def run(config: dict[str, Any], *, kind: str = "rl", ranks: int = 1, resume_from: str = "", output_dir: Path,
        sinks: Sequence[Sink], should_stop: Callable[[], bool], on_checkpoint: OnCheckpoint, on_step: OnStep,
        node: Node | None = None) -> Outcome:
    """Run the job's ``kind`` (rl, sft, sft_then_rl) as ``config`` says until done or ``should_stop()``, with
    the job's own fields: ``ranks`` per node, the checkpoint it continues from (``resume_from``); with
    ``node``, as the first node of a multi-node job (rl only: a warm start runs on one host).

    The caller keeps ownership of ``sinks`` (closes them). Raises ``TrackingError`` when progress or
    checkpoints could not be stored.
    """
    if kind == "rl":
        return run_rl(config, ranks=ranks, resume_from=resume_from, output_dir=output_dir, sinks=sinks,
                      should_stop=should_stop, on_checkpoint=on_checkpoint, on_step=on_step, node=node)
    if node is not None:
        raise ValueError(f"a {kind} job runs on one host; launch it with nodes=1")
    if kind == "sft":
        outcome, _ = run_warm_start(config, output_dir=output_dir, sinks=sinks, should_stop=should_stop,
                                    on_checkpoint=on_checkpoint, on_step=on_step)
        return outcome
    if kind == "sft_then_rl":
        return run_sft_then_rl(config, resume_from=resume_from, output_dir=output_dir, sinks=sinks,
                               should_stop=should_stop, on_checkpoint=on_checkpoint, on_step=on_step)
    raise ValueError(f"Unknown job kind {kind!r}; use rl, sft or sft_then_rl")


def warm_start_steps(config: dict[str, Any]) -> int:
    """The warm start's optimizer steps as the config sets them: the RL phase's step offset."""
    from trainer.config import SFTConfig, from_dict

    return int(from_dict(SFTConfig, config.get("sft") or {}, "sft.").total_steps)


def run_warm_start(config: dict[str, Any], *, output_dir: Path, sinks: Sequence[Sink],
                   should_stop: Callable[[], bool], on_checkpoint: OnCheckpoint,
                   on_step: OnStep) -> tuple[Outcome, str | None]:
    """``trainer.sft.run_sft`` into ``<output_dir>/sft``: its loss and evaluation to the sinks, its steps as
    progress, its saved model as a checkpoint. Returns the outcome and the saved model's path (None when
    cancelled: a stopped warm start saves nothing)."""
    from trainer.sft import run_sft

    watcher = CheckpointWatcher(on_checkpoint, on_step)
    result = run_sft(trainer_config(config, output_dir), sinks=[*map(Lent, sinks), watcher],
                     should_stop=lambda: watcher.error is not None or should_stop())
    if watcher.error is not None:
        raise TrackingError(watcher.error)
    outcome = Outcome(cancelled=result["state"] == "cancelled", final_metrics=dict(result["metrics"]),
                      last_step=int(result["step"]))
    return outcome, result["path"]


def warm_started(model: dict[str, Any], path: str) -> dict[str, Any]:
    """The ``model`` section of an sft_then_rl job's RL phase: the model its warm start saved at ``path`` (a
    safetensors folder), whatever the warm start loaded (the tiny model, a folder, a GGUF file)."""
    return {**model, "path": path, "build_tiny": False, "gguf_file": None}


def run_sft_then_rl(config: dict[str, Any], *, resume_from: str = "", output_dir: Path, sinks: Sequence[Sink],
                    should_stop: Callable[[], bool], on_checkpoint: OnCheckpoint, on_step: OnStep) -> Outcome:
    """The warm start, then RL from its weights, RL's steps after the warm start's. A job that resumes
    (``resume_from``) is past its warm start: it trains RL only, from the model its config names."""
    offset = warm_start_steps(config)
    warm: dict[str, Any] = {}
    if not resume_from:
        # The warm start's model is not an RL checkpoint: resuming the job continues RL, never the warm start.
        sft, path = run_warm_start(config, output_dir=output_dir, sinks=[WarmStartPhase(s) for s in sinks],
                                   should_stop=should_stop, on_checkpoint=lambda *_: None, on_step=on_step)
        if sft.cancelled or path is None:
            return sft
        warm = {k if k.startswith("sft/") else f"sft/{k}": v for k, v in sft.final_metrics.items()}
        config = {**config, "model": warm_started(config.get("model") or {}, path)}
    rl = run_rl(config, resume_from=resume_from, output_dir=output_dir, sinks=[Offset(s, offset) for s in sinks],
                should_stop=should_stop,
                on_checkpoint=lambda step, path, metrics: on_checkpoint(offset + step, path, metrics),
                on_step=lambda step: on_step(offset + step))
    return Outcome(cancelled=rl.cancelled, final_metrics={**warm, **rl.final_metrics}, last_step=offset + rl.last_step)


def run_rl(config: dict[str, Any], *, ranks: int = 1, resume_from: str = "", output_dir: Path, sinks: Sequence[Sink],
           should_stop: Callable[[], bool], on_checkpoint: OnCheckpoint, on_step: OnStep,
           node: Node | None = None) -> Outcome:
    """Train RL as ``config`` says until done or ``should_stop()``, continuing from ``resume_from`` when set.
    ``ranks`` > 1 runs as a ``torchrun`` process group (``run_ranks``); with ``node``, as the first node of a
    multi-node job.
    """
    if ranks > 1 or node is not None:
        return run_ranks(config, ranks=ranks, resume_from=resume_from, output_dir=output_dir, sinks=sinks,
                         should_stop=should_stop, on_checkpoint=on_checkpoint, on_step=on_step, node=node)
    from trainer import train

    watcher = CheckpointWatcher(on_checkpoint, on_step)
    result = train(trainer_config(config, output_dir), sinks=[*map(Lent, sinks), watcher],
                   resume=resume_from or None,
                   should_stop=lambda: watcher.error is not None or should_stop())
    if watcher.error is not None:
        raise TrackingError(watcher.error)
    step = int(result.get("step", watcher.last_step))
    return Outcome(cancelled=result.get("state") == "cancelled", final_metrics=dict(result.get("metrics") or {}),
                   last_step=step)


def die_with(parent: int) -> Callable[[], None]:
    """A ``preexec_fn`` that has the kernel SIGTERM the child when ``parent`` dies, however it dies.

    ``torchrun`` runs in a session of its own (so cancel and errors can signal the whole group), which also
    keeps it out of the worker's process group: without this, a SIGKILLed worker (OOM, a crashed host's
    supervisor) left its ranks training on, unseen, until the heartbeat sweep failed the job, and they
    kept the job's devices. On SIGTERM ``torchrun`` stops its ranks (SIGTERM, then SIGKILL after 30 s).
    The signal follows the thread that forks, which is the task's own thread for as long as it waits.
    ``prctl`` is looked up here, before the fork: the child only calls it (no import, no lookup while
    another thread might hold a lock the fork copied)."""
    import ctypes
    import os
    import signal
    import sys

    if not sys.platform.startswith("linux"):
        return lambda: None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    pr_set_pdeathsig, sigterm = 1, int(signal.SIGTERM)

    def tether() -> None:
        prctl(pr_set_pdeathsig, sigterm, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the call: we were already handed to init
            os._exit(1)

    return tether


@dataclass(frozen=True)
class Node:
    """One node of a multi-node job: ``rank`` of ``count`` hosts, meeting at the first one's ``endpoint``."""

    rank: int
    count: int
    endpoint: str  # HOST:PORT of the first node's rendezvous (torchrun's TCP store)


# How long the first node waits for the others to join before the job fails (torchrun's rendezvous).
NODE_JOIN_TIMEOUT_S = 120


def start_torchrun(config: dict[str, Any], output_dir: Path, node: Node | None, ranks: int = 1,
                   resume_from: str = "") -> tuple[Any, Path, Path]:
    """Start this host's ``torchrun`` for the job: ``ranks`` ranks, one node (``--standalone``) or
    node ``node.rank`` of ``node.count``. Returns the process, its stderr log and its stdout file.

    Several nodes use torchrun's ``static`` rendezvous, which keeps the node rank it is given (``c10d``
    orders nodes as they join), so global rank 0, which alone writes events, is on the first node: the
    node whose task follows ``events.jsonl`` into the database."""
    import os
    import subprocess
    import sys

    from trainer.config import save_config

    suffix = f"-node-{node.rank}" if node is not None and node.rank else ""  # the folder may be shared
    launch = output_dir / f"launch{suffix}.yaml"
    save_config(trainer_config(config, output_dir), launch)
    if node is None:
        where = ["--standalone"]
    else:
        where = ["--nnodes", str(node.count), "--node-rank", str(node.rank), "--rdzv-backend", "static",
                 "--rdzv-endpoint", node.endpoint, "--rdzv-conf", f"timeout={NODE_JOIN_TIMEOUT_S}"]
    cmd = [sys.executable, "-m", "torch.distributed.run", *where, "--nproc_per_node", str(ranks),
           "--monitor-interval", "1", "-m", "webapp.jobs.child", "rank", "train", str(launch), "--stop-file",
           str(output_dir / "STOP")]
    if resume_from:
        cmd += ["--resume", resume_from]
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)  # torchrun sets them; stale ones would point the ranks elsewhere
    log_file, out_file = output_dir / f"ranks{suffix}.log", output_dir / f"ranks{suffix}.out"
    with log_file.open("ab") as log, out_file.open("wb") as out:  # rank 0 prints the run's result line to out
        proc = subprocess.Popen(cmd, stdout=out, stderr=log, env=env, start_new_session=True,
                                preexec_fn=die_with(os.getpid()))
    return proc, log_file, out_file


def run_ranks(config: dict[str, Any], *, ranks: int = 1, resume_from: str = "", output_dir: Path,
              sinks: Sequence[Sink], should_stop: Callable[[], bool], on_checkpoint: OnCheckpoint, on_step: OnStep,
              node: Node | None = None, poll: float = 0.5) -> Outcome:
    """``ranks`` ranks of ``agentfly train`` under ``torchrun``, in a process group of their own
    (with ``node``: the first node's ranks of a multi-node job, the others run by ``run_node``).

    Rank 0 alone writes ``events.jsonl``; this process follows it and hands each event to the sinks (the
    database sink included), so the job's events are rank 0's. Cancel writes the stop file the ranks check
    together between steps (they end with a checkpoint, as one process does). A rank that dies makes
    ``torchrun`` stop the others and exit non-zero: the job fails with its output, and the checkpoints
    already written stay (``resume`` continues from the last). ``torchrun`` dies with this process
    (``die_with``): a worker that is killed takes its ranks with it, and its job fails in the sweep."""
    import os
    import signal

    world = ranks * (node.count if node else 1)
    stop_file = output_dir / "STOP"
    # Under the web app's worker the STOP file is the worker's (root's, read-only to this job's uid): the
    # ranks stop on it as it is, and this process neither removes nor touches it (``run_process`` cleared it).
    with contextlib.suppress(PermissionError):
        stop_file.unlink(missing_ok=True)
    events = output_dir / "events.jsonl"
    start_at = events.stat().st_size if events.exists() else 0  # a resumed job appends to its run's file
    proc, log_file, result_file = start_torchrun(config, output_dir, node, ranks, resume_from)
    watcher = CheckpointWatcher(on_checkpoint, on_step)
    targets = [*sinks, watcher]
    offset, pending = start_at, b""
    cancelled = False

    def follow() -> None:
        nonlocal offset, pending
        if not events.exists():
            return
        with events.open("rb") as f:
            f.seek(offset)
            chunk = f.read()
        offset += len(chunk)
        pending += chunk
        *lines, pending = pending.split(b"\n")  # a line still being written waits for its newline
        for line in lines:
            if line.strip():
                event: Event = json.loads(line)
                for sink in targets:
                    sink.emit(event)

    try:
        while proc.poll() is None:
            if not cancelled and (should_stop() or watcher.error is not None):
                cancelled = True
                with contextlib.suppress(FileExistsError):  # made already when it is the worker's request
                    stop_file.touch(exist_ok=False)
            follow()
            time.sleep(poll)
        follow()
    except BaseException:
        os.killpg(proc.pid, signal.SIGTERM)  # every rank: they share the group torchrun leads
        proc.wait(30)
        raise
    if watcher.error is not None:
        raise TrackingError(watcher.error)
    out = result_file.read_text(errors="replace")
    if proc.returncode < 0:  # torchrun itself was killed; its ranks die with it (die_with_launcher)
        raise RuntimeError(f"torchrun was killed by {signal.Signals(-proc.returncode).name}, and its {world} ranks "
                           f"with it; the last checkpoint is kept, resume the job to continue "
                           f"(all output: {log_file})")
    if proc.returncode != 0:
        text = log_file.read_text(errors="replace")
        # The rank's own error, not torchrun's summary of it (which names only the exit code).
        errors = [line.strip() for line in text.splitlines()
                  if re.match(r"^\s*(\[rank\d+\]:)?\s*[\w.]+(Error|Exception|Interrupt): ", line)
                  and "ChildFailedError" not in line]
        cause = errors[-1] if errors else f"...{text[-800:]}"
        raise RuntimeError(f"a rank of the {world}-rank run failed (torchrun exit {proc.returncode}), so torchrun "
                           f"stopped the others; the last checkpoint is kept, resume the job to continue. "
                           f"Cause: {cause} (all output: {log_file})")
    lines = [line for line in out.splitlines() if line.startswith("{")]
    result = json.loads(lines[-1]) if lines else {}
    return Outcome(cancelled=result.get("state") == "cancelled", final_metrics=dict(watcher.last_metrics),
                   last_step=int(result.get("step", watcher.last_step)))


def run_node(config: dict[str, Any], *, ranks: int = 1, resume_from: str = "", output_dir: Path, node: Node,
             job_ended: Callable[[], bool], poll: float = 2.0) -> int:
    """Node ``node.rank`` (> 0) of a multi-node job: this host's ranks, until they exit; returns torchrun's
    exit code. They write no events (global rank 0 is on the first node) and stop with the others: cancel
    reaches them through the ranks' joint stop decision, and a failure anywhere breaks the collectives of
    all. If the job ends without them noticing (its first node's worker died), they are stopped here."""
    import os
    import signal

    proc, _, _ = start_torchrun(config, output_dir, node, ranks, resume_from)
    try:
        while proc.poll() is None:
            if job_ended():
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(60)
                break
            time.sleep(poll)
    except BaseException:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
        raise
    return int(proc.returncode)
