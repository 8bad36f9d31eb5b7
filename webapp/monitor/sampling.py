"""What the worker's machine is doing while a job trains: CPU, memory, and per-GPU utilisation and memory.

A job emits these in its ``resources`` events, next to the resource pools' stats, so the dashboard's
resource panel shows both what the job holds (sandboxes, environments) and what the host is spending.

GPU numbers come from NVML (``nvidia-ml-py``, the ``gpu`` extra), imported inside ``gpu_stats`` so a CPU
worker imports this module without it. When NVML is missing or finds no device, the result says so in
``gpu_absent`` instead of returning an empty list the dashboard could mistake for "idle GPUs".

    >>> from webapp.monitor.sampling import resource_snapshot
    >>> resource_snapshot(engine.stats())   # {"worker": {...}, "pools": {...}}
"""

from __future__ import annotations

import os
import socket
import threading
from typing import Any

import psutil

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
            _nvml_state["absent"] = "nvidia-ml-py is not installed on this worker (pip install 'agentfly[gpu]')"
            raise RuntimeError(_nvml_state["absent"]) from None
        if not _nvml_state["ready"]:
            try:
                pynvml.nvmlInit()
            except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
                _nvml_state["absent"] = f"no NVIDIA driver or GPU on this worker ({exc})"
                raise RuntimeError(_nvml_state["absent"]) from None
            _nvml_state["ready"] = True
        return pynvml


def gpu_stats() -> tuple[list[dict[str, Any]], str | None]:
    """``(gpus, absent)``: one dict per visible GPU, or ``([], reason)`` when there is no GPU to read."""
    try:
        nvml = _nvml()
    except RuntimeError as exc:
        return [], str(exc)
    gpus: list[dict[str, Any]] = []
    try:
        count = nvml.nvmlDeviceGetCount()
        for index in range(count):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            util = nvml.nvmlDeviceGetUtilizationRates(handle)
            mem = nvml.nvmlDeviceGetMemoryInfo(handle)
            name = nvml.nvmlDeviceGetName(handle)
            gpus.append({
                "index": index,
                "name": name.decode() if isinstance(name, bytes) else str(name),
                "util_percent": float(util.gpu),
                "memory_used_mb": round(mem.used / _MB, 1),
                "memory_total_mb": round(mem.total / _MB, 1),
                "memory_percent": round(100.0 * mem.used / mem.total, 1) if mem.total else 0.0,
            })
    except Exception as exc:  # a GPU fell off the bus mid-run: report it rather than crash the job's sampler
        return gpus, f"reading NVML failed: {exc}"
    if not gpus:
        return [], "NVML found no GPU on this worker"
    return gpus, None


def worker_stats() -> dict[str, Any]:
    """CPU and memory of the worker machine and of this process, plus its GPUs (or why there are none).

    ``cpu_percent`` is the machine-wide utilisation since the previous call (psutil's non-blocking form), so
    the first call of a process reads 0.0; a sampler called once per step gets the step's average.
    """
    proc = psutil.Process()
    with proc.oneshot():
        rss = proc.memory_info().rss
        threads = proc.num_threads()
        proc_cpu = proc.cpu_percent(interval=None)
    vm = psutil.virtual_memory()
    gpus, absent = gpu_stats()
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "cpu_count": psutil.cpu_count() or 1,
        "cpu_percent": psutil.cpu_percent(interval=None),
        "process_cpu_percent": proc_cpu,
        "process_rss_mb": round(rss / _MB, 1),
        "threads": threads,
        "memory_used_mb": round((vm.total - vm.available) / _MB, 1),
        "memory_total_mb": round(vm.total / _MB, 1),
        "memory_percent": vm.percent,
        "gpus": gpus,
        "gpu_absent": absent,
    }


def resource_snapshot(pools: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The payload of a ``resources`` event: ``{"worker": worker_stats(), "pools": pools}``.

    ``pools`` is ``ResourceEngine.stats()`` (name -> size, in_use, idle, waiting, created, failed,
    acquire_p50_ms, ...) of the job's resource engine, or empty when the job holds none.
    """
    return {"worker": worker_stats(), "pools": dict(pools or {})}
