"""Worker start-up: sandboxes a dead worker process left behind are cleaned up before new ones start.

A pool process killed by its time limit, the OOM killer or a SIGKILLed worker cannot clean up; its
sandboxes die with it (``PR_SET_PDEATHSIG``), and this sweep removes their folders and anything they left
running. ``worker_ready`` covers a restarted worker, ``worker_process_init`` a replaced pool process.
"""

from __future__ import annotations

import logging
from typing import Any

from celery.signals import worker_process_init, worker_ready

log = logging.getLogger(__name__)


@worker_ready.connect
@worker_process_init.connect
def sweep_sandboxes(sender: Any = None, **kwargs: Any) -> None:
    from agentfly.resources import sweep_sandboxes as sweep

    try:
        removed = sweep()
    except Exception:  # cleaning up must never stop a worker from taking jobs
        log.exception("could not sweep the sandbox folders of dead processes")
        return
    if removed:
        log.info("removed %d sandbox folder(s) of dead processes: %s", len(removed), ", ".join(map(str, removed)))
