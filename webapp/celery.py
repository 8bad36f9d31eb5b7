"""The Celery app: Redis broker and result backend, one queue per hardware class.

Training jobs go to ``cpu`` or ``gpu``; registry introspection goes to ``cpu``, "try it" calls to their
own ``try`` queue (both import user code, which must never happen in the web process; a busy "try it" never
takes a training job's queue) and MCP server inspections to ``inspect`` (a server that never starts holds
only a bounded place there, never a worker that jobs wait for). The registry's tasks opt out of the late acknowledgement below: they are
never redelivered (``webapp.registry.tasks``). ``acks_late`` with prefetch 1 means a worker takes
one job at a time and a message is only acknowledged once the task returns, so a job whose worker vanished
before starting it is redelivered; the task's conditional claim makes a redelivery of a started job a no-op.

    celery -A webapp worker -Q cpu,try,inspect -c 1
"""

from __future__ import annotations

import os

from celery import Celery
from kombu.entity import Queue

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")

app = Celery("webapp")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.update(
    task_queues=(Queue("cpu"), Queue("gpu"), Queue("try"), Queue("inspect"), Queue("alerts")),  # type: ignore[no-untyped-call]
    task_default_queue="cpu",
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    task_track_started=True,
    worker_send_task_events=True,
    broker_connection_retry_on_startup=True,
    result_expires=24 * 3600,
    # Beat (run as `celery -A webapp beat` or `worker -B`) sweeps for jobs whose worker stopped beating.
    beat_schedule={
        "fail-stale-jobs": {"task": "webapp.jobs.tasks.fail_stale_jobs", "schedule": 10.0},
        # Redis has no memory limit per user: a team's keys past AGENTFLY_TEAM_REDIS_MAX_BYTES are cut off.
        "cap-team-redis": {"task": "webapp.jobs.tasks.cap_team_redis", "schedule": 5.0},
        # Alerts have a queue of their own, so a worker busy training never holds one up.
        "scan-for-alerts": {"task": "webapp.alerts.tasks.scan_for_alerts", "schedule": 15.0,
                            "options": {"queue": "alerts"}},
    },
)
app.autodiscover_tasks(["webapp.registry", "webapp.mcpservers", "webapp.jobs", "webapp.alerts"])
app.autodiscover_tasks(["webapp.jobs"], related_name="exports")  # checkpoint exports
