"""The event stream of a run: one ordered stream of dicts, fanned out to pluggable sinks.

Every event is a JSON-serialisable dict::

    {"type": "metrics" | "samples" | "resources" | "status" | "log",
     "step": int,          # the training step it belongs to (0 before the first update)
     "time": float,        # Unix time when it was emitted
     "run": str,           # the run's output directory name
     "data": {...}}        # the payload, by type:
       metrics:   {"reward/mean": ..., "loss/policy": ..., "time/rollout": ..., ...}  (flat name -> number)
       samples:   {"trajectories": [{"text", "token_ids", "loss_mask", "logprobs", "tool_calls", "reward",
                                     "segments": [{"start", "end", "mask", "text"}], ...}]}
       resources: {"cpu_percent", "rss_mb", "threads", "gpu": [...], "pools": {...}}
       status:    {"state": "starting" | "running" | "finished" | "failed" | "cancelled", "message": str}
       log:       {"message": str, "level": "info" | "warning" | "error"}

A sink is anything with ``emit(event: dict) -> None`` and ``close() -> None`` (``Sink`` below). The web
app passes its own (it writes to the database and to the job's channel group); ``CallbackSink`` wraps a
plain function. A sink that raises is reported once on stderr and then skipped, so a broken dashboard never
stops training; the JSONL file is always written.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

EVENT_TYPES = ("metrics", "samples", "resources", "status", "log")


@runtime_checkable
class Sink(Protocol):
    def emit(self, event: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def _jsonable(value: Any) -> Any:
    """NaN and infinities become null (JSON has neither); tensors and numpy scalars become numbers."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 1) == 0:
        return _jsonable(value.item())
    return value


class JSONLSink:
    """Appends one JSON line per event to ``path`` and flushes, so a crash loses nothing already emitted."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = self.path.open("a", encoding="utf-8")

    def emit(self, event: dict[str, Any]) -> None:
        self._fh.write(json.dumps(event, ensure_ascii=False) + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


class CallbackSink:
    """Calls ``fn(event)`` for every event (the web app's sink, or a test's list.append)."""

    def __init__(self, fn: Callable[[dict[str, Any]], Any], close: Callable[[], Any] | None = None) -> None:
        self.fn = fn
        self._close = close

    def emit(self, event: dict[str, Any]) -> None:
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

    def emit(self, event: dict[str, Any]) -> None:
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

    def emit(self, type: str, step: int, data: dict[str, Any]) -> dict[str, Any]:
        if type not in EVENT_TYPES:
            raise ValueError(f"unknown event type {type!r}; use one of {EVENT_TYPES}")
        event = {"type": type, "step": int(step), "time": time.time(), "run": self.run, "data": _jsonable(data)}
        for i, sink in enumerate(self.sinks):
            if i in self._failed:
                continue
            try:
                sink.emit(event)
            except Exception as exc:  # a broken sink must not stop training
                self._failed.add(i)
                print(f"agentfly: event sink {sink!r} failed and is disabled: {exc!r}", file=sys.stderr)
        return event

    def metrics(self, step: int, values: dict[str, Any]) -> dict[str, Any]:
        return self.emit("metrics", step, values)

    def status(self, step: int, state: str, message: str = "") -> dict[str, Any]:
        return self.emit("status", step, {"state": state, "message": message})

    def log(self, step: int, message: str, level: str = "info") -> dict[str, Any]:
        return self.emit("log", step, {"message": message, "level": level})

    def close(self) -> None:
        for sink in self.sinks:
            try:
                sink.close()
            except Exception as exc:
                print(f"agentfly: closing event sink {sink!r} failed: {exc!r}", file=sys.stderr)


def read_events(path: str | os.PathLike[str], type: str | None = None) -> list[dict[str, Any]]:
    """The events of a JSONL file (optionally of one type), e.g. to plot a finished run."""
    events = []
    with Path(path).open(encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                event = json.loads(line)
                if type is None or event["type"] == type:
                    events.append(event)
    return events


def resource_stats() -> dict[str, Any]:
    """CPU, memory and (when NVML is present) GPU utilisation of this process and machine."""
    import psutil

    proc = psutil.Process()
    stats: dict[str, Any] = {
        "cpu_percent": psutil.cpu_percent(interval=None),
        "rss_mb": proc.memory_info().rss / 2**20,
        "threads": proc.num_threads(),
        "memory_percent": psutil.virtual_memory().percent,
        "gpu": [],
    }
    try:
        import pynvml  # from nvidia-ml-py, the `gpu` extra

        pynvml.nvmlInit()
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            stats["gpu"].append({"index": i, "util_percent": pynvml.nvmlDeviceGetUtilizationRates(h).gpu,
                                 "memory_used_mb": mem.used / 2**20, "memory_total_mb": mem.total / 2**20})
    except Exception:  # no NVML or no GPU: CPU-only stats
        pass
    return stats
