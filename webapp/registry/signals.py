"""When a worker starts: built-ins appear by themselves (workers may run newer code), and stored entries the
registry's rule refuses are marked failed, so no job can select them."""

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


@worker_ready.connect
def fail_unregistrable(sender: Any = None, **kwargs: Any) -> None:
    from webapp.registry.worker import fail_unregistrable_entries

    try:
        refused = fail_unregistrable_entries()
        if refused:
            log.warning("registry: %d stored entries name code the rule refuses; marked failed: %s", len(refused), refused)
    except Exception:
        log.exception("registry: could not check the stored entries against the rule")
