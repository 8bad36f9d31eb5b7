"""The event stream of a run: one ordered stream of typed events, fanned out to pluggable sinks.

This module is the event contract between the trainer and whatever watches it (the JSONL file, TensorBoard,
the web app's database sink and dashboard). Every event is an ``Event``::

    {"type": EventType, "step": int, "time": float, "run": str, "data": <the payload of its type>}

``step`` is the training step it belongs to (0 before the first update), ``time`` Unix time, ``run`` the
output directory's name. The payloads, one ``TypedDict`` each:

    metrics     MetricsData     flat name -> number ("reward/mean", "loss/policy", "time/rollout", ...)
    samples     SamplesData     {"trajectories": [Trajectory.to_dict(tokenizer), ...]}
    resources   ResourcesData   {"host": HostStats, "engine": Engine.stats(), "pools": ResourceEngine.stats()}
    status      StatusData      {"state": JobState, "message": str, "level"?: LogLevel}
    checkpoint  CheckpointData  {"path": str, "step": int, "score": float | None}  (on every save)
    log         LogData         {"message": str, "level": "info" | "warning" | "error",
                                 "traceback"?: str, "checkpoint"?: str}

``RunState`` is the one status vocabulary of a run, shared with the web app's jobs
(``queued -> running -> succeeded | failed | cancelled``); a job of the web app may also be ``preempted``
(``JobState``), which the trainer never emits.

Every event is made by one constructor here (``metrics_event``, ``samples_event``, ``resources_event``,
``status_event``, ``checkpoint_event``, ``log_event``; ``make_event`` for a type chosen at run time): the
trainer's ``EventStream``, the web app's own status and log events, and the synthetic histories of tests
and benchmarks. Sinks store an event as it is made; a reader can rely on the payload of its type.

A sink is anything with ``emit(event) -> None`` and ``close() -> None`` (``Sink`` below). The web app
passes its own (it writes to the database and to the job's channel group); ``CallbackSink`` wraps a
plain function. A sink that raises is reported once on stderr and then skipped, so a broken dashboard never
stops training; the JSONL file is always written.
"""

from __future__ import annotations

import json
import math
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal, NotRequired, Protocol, TypedDict, get_args, runtime_checkable

EventType = Literal["metrics", "samples", "resources", "status", "checkpoint", "log"]
EVENT_TYPES: tuple[EventType, ...] = get_args(EventType)

RunState = Literal["queued", "running", "succeeded", "failed", "cancelled"]
RUN_STATES: tuple[RunState, ...] = get_args(RunState)
FINAL_STATES: tuple[RunState, ...] = ("succeeded", "failed", "cancelled")
# A web-app job's states: a run's, and ``preempted`` (it yielded its worker and waits to resume).
JobState = Literal["queued", "running", "succeeded", "failed", "cancelled", "preempted"]
JOB_STATES: tuple[JobState, ...] = get_args(JobState)

LogLevel = Literal["info", "warning", "error"]

MetricsData = dict[str, float]


class SamplesData(TypedDict):
    trajectories: list[dict[str, Any]]  # Trajectory.to_dict(tokenizer): the rollout layer's one serialisation


class GPUStats(TypedDict):
    index: int
    name: str
    util_percent: float
    memory_used_mb: float
    memory_total_mb: float
    memory_percent: float


class HostStats(TypedDict):
    host: str
    pid: int
    cpu_count: int
    cpu_percent: float
    process_cpu_percent: float
    process_rss_mb: float
    threads: int
    memory_used_mb: float
    memory_total_mb: float
    memory_percent: float
    gpus: list[GPUStats]
    gpu_absent: str | None  # why ``gpus`` is empty (no NVML, no driver, no device); None when GPUs were read


class ResourcesData(TypedDict):
    host: HostStats
    engine: dict[str, float]  # Engine.stats() of the rollout engine
    pools: dict[str, dict[str, Any]]  # ResourceEngine.stats(): name -> size, in_use, peak_in_use (the most held
    #                                   during the step: in_use is sampled between steps), idle, waiting, ...


class StatusData(TypedDict):
    state: JobState
    message: str
    level: NotRequired[LogLevel]  # "error" on a failed job's status, so the log shows it as an error


class CheckpointData(TypedDict):
    path: str
    step: int
    score: float | None  # the held-out accuracy it was saved with, when an evaluation preceded the save


class GatewayEndpoint(TypedDict):
    url: str  # the OpenAI base_url the team's agents use
    job_key: str  # the job's key: takes rollouts (GET /v1/samples), each with its own key; revoked at the end


class LogData(TypedDict):
    message: str
    level: LogLevel
    traceback: NotRequired[str]  # the worker's traceback of a job that failed, or a reward's that raised
    checkpoint: NotRequired[str]  # the path, on the web app's "checkpoint saved" line
    gateway: NotRequired[GatewayEndpoint]  # a gateway job's endpoint, on its "gateway serving" line


class Event(TypedDict):
    type: EventType
    step: int
    time: float
    run: str
    data: dict[str, Any]


@runtime_checkable
class Sink(Protocol):
    def emit(self, event: Event) -> None: ...

    def close(self) -> None: ...


def jsonable(value: Any, *, nul: str | None = None) -> Any:
    """``value`` as JSON can hold it: NaN and infinities become null (JSON has neither; a gap in a chart),
    a tensor or numpy value holding one number becomes that number, mappings become dicts with string keys.

    nul: what a NUL character in a string becomes (None: it is kept). The web app's store passes U+FFFD:
    PostgreSQL's jsonb refuses NUL, which an untrained model samples like any other token, and one refused
    value would lose its whole batch of events."""
    if isinstance(value, str):
        return value if nul is None else value.replace("\x00", nul)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {jsonable(str(k), nul=nul): jsonable(v, nul=nul) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v, nul=nul) for v in value]
    if callable(getattr(value, "item", None)):  # torch and numpy: one number (a larger one is left as it is)
        size = value.numel() if callable(getattr(value, "numel", None)) else getattr(value, "size", 1)
        if size == 1:
            return jsonable(value.item(), nul=nul)
    return value


def make_event(type: EventType, step: int, data: Mapping[str, Any], *, run: str = "",
               at: float | None = None) -> Event:
    """An event of ``type`` at ``step`` carrying ``data`` as JSON holds it (``jsonable``), stamped now (or
    ``at``). The constructors below fix each type's payload; this one is for a type chosen at run time."""
    if type not in EVENT_TYPES:
        raise ValueError(f"unknown event type {type!r}; use one of {EVENT_TYPES}")
    return {"type": type, "step": int(step), "time": time.time() if at is None else float(at), "run": run,
            "data": jsonable(dict(data))}


def metrics_event(step: int, values: Mapping[str, float], *, run: str = "", at: float | None = None) -> Event:
    return make_event("metrics", step, values, run=run, at=at)


def samples_event(step: int, trajectories: list[dict[str, Any]], *, run: str = "", at: float | None = None
                  ) -> Event:
    return make_event("samples", step, SamplesData(trajectories=trajectories), run=run, at=at)


def resources_event(step: int, engine: Mapping[str, float], pools: Mapping[str, dict[str, Any]] | None = None,
                    *, host: HostStats | None = None, run: str = "", at: float | None = None) -> Event:
    """Resource stats at ``step``: the rollout engine's, its pools', and ``host`` (this machine's, read now,
    when not given)."""
    return make_event("resources", step, ResourcesData(host=host if host is not None else host_stats(),
                                                        engine=dict(engine), pools=dict(pools or {})),
                      run=run, at=at)


def status_event(step: int, state: JobState, message: str = "", *, level: LogLevel | None = None,
                 run: str = "", at: float | None = None) -> Event:
    if state not in JOB_STATES:
        raise ValueError(f"unknown run state {state!r}; use one of {JOB_STATES}")
    data = StatusData(state=state, message=message)
    if level is not None:
        data["level"] = level
    return make_event("status", step, data, run=run, at=at)


def checkpoint_event(step: int, path: str | os.PathLike[str], score: float | None = None, *, run: str = "",
                     at: float | None = None) -> Event:
    return make_event("checkpoint", step, CheckpointData(path=os.fspath(path), step=int(step), score=score),
                      run=run, at=at)


def log_event(step: int, message: str, level: LogLevel = "info", *, traceback: str | None = None,
              checkpoint: str | None = None, gateway: GatewayEndpoint | None = None, run: str = "",
              at: float | None = None) -> Event:
    data = LogData(message=message, level=level)
    if traceback is not None:
        data["traceback"] = traceback
    if checkpoint is not None:
        data["checkpoint"] = checkpoint
    if gateway is not None:
        data["gateway"] = gateway
    return make_event("log", step, data, run=run, at=at)


class JSONLSink:
    """Appends one JSON line per event to ``path`` and flushes, so a crash loses nothing already emitted."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = self.path.open("a", encoding="utf-8")

    def emit(self, event: Event) -> None:
        self._fh.write(json.dumps(event, ensure_ascii=False) + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


class CallbackSink:
    """Calls ``fn(event)`` for every event (the web app's sink, or a test's list.append)."""

    def __init__(self, fn: Callable[[Event], Any], close: Callable[[], Any] | None = None) -> None:
        self.fn = fn
        self._close = close

    def emit(self, event: Event) -> None:
        self.fn(event)

    def close(self) -> None:
        if self._close is not None:
            self._close()


class TensorBoardSink:
    """Metric events as TensorBoard scalars (``tensorboard`` must be installed: ``pip install tensorboard``)."""

    def __init__(self, logdir: str | os.PathLike[str]) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise RuntimeError("tensorboard=true needs the tensorboard package: pip install tensorboard") from exc
        self.writer = SummaryWriter(os.fspath(logdir))

    def emit(self, event: Event) -> None:
        if event["type"] == "metrics":
            for name, value in event["data"].items():
                if isinstance(value, (int, float)) and value is not None:
                    self.writer.add_scalar(name, value, event["step"])

    def close(self) -> None:
        self.writer.close()


class EventStream:
    """Stamps events and hands each to every sink, in order."""

    def __init__(self, sinks: Iterable[Sink], run: str = "") -> None:
        self.sinks = list(sinks)
        for sink in self.sinks:
            if not (callable(getattr(sink, "emit", None)) and callable(getattr(sink, "close", None))):
                raise TypeError(f"{sink!r} is not an event sink: it needs emit(event: dict) and close() methods")
        self.run = run
        self._failed: set[int] = set()

    def emit(self, type: EventType, step: int, data: Mapping[str, Any]) -> Event:
        return self.send(make_event(type, step, data, run=self.run))

    def send(self, event: Event) -> Event:
        """Hand a made event to every sink, in order; a sink that raises is disabled, not fatal."""
        for i, sink in enumerate(self.sinks):
            if i in self._failed:
                continue
            try:
                sink.emit(event)
            except Exception as exc:  # a broken sink must not stop training
                self._failed.add(i)
                print(f"agentfly: event sink {sink!r} failed and is disabled: {exc!r}", file=sys.stderr)
        return event

    def metrics(self, step: int, values: Mapping[str, float]) -> Event:
        return self.send(metrics_event(step, values, run=self.run))

    def samples(self, step: int, trajectories: list[dict[str, Any]]) -> Event:
        return self.send(samples_event(step, trajectories, run=self.run))

    def resources(self, step: int, engine: Mapping[str, float], pools: Mapping[str, dict[str, Any]] | None = None
                  ) -> Event:
        return self.send(resources_event(step, engine, pools, run=self.run))

    def status(self, step: int, state: RunState, message: str = "") -> Event:
        if state not in RUN_STATES:  # the trainer's runs never say "preempted": only a web-app job is
            raise ValueError(f"unknown run state {state!r}; use one of {RUN_STATES}")
        return self.send(status_event(step, state, message, run=self.run))

    def checkpoint(self, step: int, path: str | os.PathLike[str], score: float | None = None) -> Event:
        return self.send(checkpoint_event(step, path, score, run=self.run))

    def log(self, step: int, message: str, level: LogLevel = "info", traceback: str | None = None) -> Event:
        return self.send(log_event(step, message, level, traceback=traceback, run=self.run))

    def close(self) -> None:
        for sink in self.sinks:
            try:
                sink.close()
            except Exception as exc:
                print(f"agentfly: closing event sink {sink!r} failed: {exc!r}", file=sys.stderr)


def read_events(path: str | os.PathLike[str], type: EventType | None = None) -> list[Event]:
    """The events of a JSONL file (optionally of one type), e.g. to plot a finished run."""
    events: list[Event] = []
    with Path(path).open(encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                event = json.loads(line)
                if type is None or event["type"] == type:
                    events.append(event)
    return events


_MB = 2**20

# NVML is initialised once per process; nvmlInit is cheap to repeat but nvmlShutdown would race other users.
_nvml_lock = threading.Lock()
_nvml_state: dict[str, Any] = {"ready": False, "absent": None}


def _nvml() -> Any:
    """The ``pynvml`` module, initialised; raises ``RuntimeError`` saying why GPUs cannot be read."""
    with _nvml_lock:
        if _nvml_state["absent"] is not None:
            raise RuntimeError(_nvml_state["absent"])
        try:
            import pynvml  # the `gpu` extra: pip install nvidia-ml-py
        except ImportError:
            _nvml_state["absent"] = "nvidia-ml-py is not installed on this machine (pip install 'agentfly[gpu]')"
            raise RuntimeError(_nvml_state["absent"]) from None
        if not _nvml_state["ready"]:
            try:
                pynvml.nvmlInit()
            except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
                _nvml_state["absent"] = f"no NVIDIA driver or GPU on this machine ({exc})"
                raise RuntimeError(_nvml_state["absent"]) from None
            _nvml_state["ready"] = True
        return pynvml


def gpu_stats() -> tuple[list[GPUStats], str | None]:
    """``(gpus, absent)``: one entry per visible GPU, or ``([], reason)`` when there is no GPU to read (so an
    empty list is never mistaken for idle GPUs)."""
    try:
        nvml = _nvml()
    except RuntimeError as exc:
        return [], str(exc)
    gpus: list[GPUStats] = []
    try:
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            util = nvml.nvmlDeviceGetUtilizationRates(handle)
            mem = nvml.nvmlDeviceGetMemoryInfo(handle)
            name = nvml.nvmlDeviceGetName(handle)
            gpus.append(GPUStats(
                index=index, name=name.decode() if isinstance(name, bytes) else str(name),
                util_percent=float(util.gpu), memory_used_mb=round(mem.used / _MB, 1),
                memory_total_mb=round(mem.total / _MB, 1),
                memory_percent=round(100.0 * mem.used / mem.total, 1) if mem.total else 0.0))
    except Exception as exc:  # a GPU fell off the bus mid-run: report it rather than crash the run
        return gpus, f"reading NVML failed: {exc}"
    if not gpus:
        return [], "NVML found no GPU on this machine"
    return gpus, None


def host_stats() -> HostStats:
    """CPU and memory of this machine and process, and its GPUs (or why there are none): the ``host`` of a
    ``resources`` event, the one host-stats function of the trainer and the web app.

    ``cpu_percent`` is the machine-wide utilisation since the previous call (psutil's non-blocking form), so
    the first call of a process reads 0.0; a caller sampling once per step gets the step's average.
    """
    import psutil

    proc = psutil.Process()
    with proc.oneshot():
        rss = proc.memory_info().rss
        threads = proc.num_threads()
        proc_cpu = proc.cpu_percent(interval=None)
    vm = psutil.virtual_memory()
    gpus, absent = gpu_stats()
    return HostStats(
        host=socket.gethostname(), pid=os.getpid(), cpu_count=psutil.cpu_count() or 1,
        cpu_percent=psutil.cpu_percent(interval=None), process_cpu_percent=proc_cpu,
        process_rss_mb=round(rss / _MB, 1), threads=threads,
        memory_used_mb=round((vm.total - vm.available) / _MB, 1), memory_total_mb=round(vm.total / _MB, 1),
        memory_percent=vm.percent, gpus=gpus, gpu_absent=absent)
