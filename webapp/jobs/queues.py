"""Which Celery queues have a worker listening, asked of the workers themselves and cached briefly.

A job launched on a queue that nobody consumes waits forever; for the ``gpu`` queue (workers only on GPU
hosts) the launch form refuses it up front. The broadcast waits ``timeout`` seconds for replies, so the
answer is cached for ``AGENTFLY_WORKER_CHECK_CACHE_SECONDS`` to keep launches fast.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from django.conf import settings

log = logging.getLogger(__name__)

_cache: dict[str, tuple[float, bool]] = {}


def consumed_queues(timeout: float = 1.0) -> set[str]:
    """The queue names that at least one live worker consumes (empty when no worker answers)."""
    from webapp.celery import app

    try:
        replies = app.control.inspect(timeout=timeout).active_queues() or {}
    except Exception:  # the broker is unreachable: no worker can be reached either
        log.warning("could not ask the workers which queues they consume", exc_info=True)
        return set()
    return {q["name"] for queues in replies.values() for q in queues or []}


def queue_has_worker(queue: str) -> bool:
    now = time.monotonic()
    hit = _cache.get(queue)
    if hit is not None and now - hit[0] < settings.AGENTFLY_WORKER_CHECK_CACHE_SECONDS:
        return hit[1]
    queues = consumed_queues()
    for name in {queue, *queues}:
        _cache[name] = (now, name in queues)
    return queue in queues


def forget() -> None:
    """Drop the cached answers (a test that starts or stops a worker)."""
    _cache.clear()
    _devices.clear()


# ------------------------------------------------------------------------------------------ devices
_devices: dict[str, tuple[float, dict[str, Any]]] = {}


def local_devices() -> dict[str, int]:
    """What this worker can give a job's ranks: its GPUs (CUDA devices torch sees) and CPU cores."""
    gpus = 0
    try:
        import torch

        gpus = int(torch.cuda.device_count())
    except ImportError:  # a worker without torch cannot train at all; it has no GPU to offer either
        pass
    return {"gpus": gpus, "cpus": os.cpu_count() or 1}


def device_replies(timeout: float = 3.0) -> dict[str, Any]:
    """Every worker's ``agentfly_devices`` answer, by worker name; cached like ``queue_has_worker`` (an empty
    answer is not: a worker that was busy answers the next launch)."""
    now = time.monotonic()
    hit = _devices.get("replies")
    if hit is not None and now - hit[0] < settings.AGENTFLY_WORKER_CHECK_CACHE_SECONDS:
        return hit[1]
    from webapp.celery import app

    replies: dict[str, Any] = {}
    for _ in range(2):  # a loaded worker may miss one short window; a second ask costs only on refusal
        try:
            # The custom inspect command of webapp.jobs.tasks, asked the way Inspect asks its own commands.
            replies = app.control.inspect(timeout=timeout)._request("agentfly_devices") or {}
        except Exception:
            log.warning("could not ask the workers what devices they have", exc_info=True)
        if replies:
            break
    replies = {name: r for name, r in replies.items() if isinstance(r, dict)}
    if replies:
        _devices["replies"] = (now, replies)
    return replies


def _device_key(queue: str) -> str:
    return "gpus" if queue == "gpu" else "cpus"


def most_ranks(queue: str) -> int:
    """The most ranks one job on ``queue`` can get on one host, as the workers consuming it report
    (``agentfly_devices``): GPUs on the ``gpu`` queue, CPU cores elsewhere; 0 when no worker answers."""
    key = _device_key(queue)
    return max((int(r.get(key, 0)) for r in device_replies().values() if queue in r.get("queues", [])), default=0)


def hosts_with(queue: str, ranks: int) -> set[str]:
    """The hosts with a worker on ``queue`` that can give ``ranks`` ranks: how many nodes a job may ask for.
    A host is the part after ``@`` of the worker's name (``celery worker -n NAME@HOST``; Celery's default
    is the machine's hostname), so two workers of one machine count once unless named as two hosts."""
    key = _device_key(queue)
    return {str(r.get("host", host_of(name))) for name, r in device_replies().items()
            if queue in r.get("queues", []) and int(r.get(key, 0)) >= ranks}


def host_of(worker_name: str) -> str:
    """``NAME@HOST`` -> ``HOST``: the host a Celery worker's name says it runs on."""
    return worker_name.partition("@")[2] or worker_name
