"""Built-ins appear by themselves: each worker registers them when it starts (workers may run newer code)."""

from __future__ import annotations

import logging
from typing import Any

from celery.signals import worker_ready

log = logging.getLogger(__name__)


@worker_ready.connect
def register_builtins(sender: Any = None, **kwargs: Any) -> None:
    from webapp.registry.tasks import sync_builtins

    try:
        count = sync_builtins()
        log.info("registry: %d built-in tools and rewards are up to date", count)
    except Exception:  # a broken built-in must not stop the worker from taking jobs
        log.exception("registry: could not register the built-in tools and rewards")
