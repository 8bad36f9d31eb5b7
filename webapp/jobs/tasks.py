"""The Celery tasks of jobs: ``run_job`` (the training task) and ``fail_stale_jobs`` (the heartbeat sweep).

``run_job`` takes an id, re-fetches the row and claims it with a conditional update; a message for a job
that is gone, cancelled or already claimed (a redelivery after ``acks_late``) returns quietly. While the
body runs, a heartbeat thread stamps the row and reads the cancel flag, which the body checks between steps.
"""

from __future__ import annotations

import logging
import threading
import traceback
from collections.abc import Callable
from typing import Any

from celery import shared_task
from celery.exceptions import SoftTimeLimitExceeded
from celery.worker.control import inspect_command
from django.conf import settings
from django.db import connection

from webapp.jobs import cluster, paths, worker
from webapp.jobs.models import Status, TrainingJob
from webapp.jobs.queues import host_of

log = logging.getLogger(__name__)


class Heartbeat:
    """Stamps the job alive every ``JOB_HEARTBEAT_SECONDS`` and mirrors its cancel flag into ``cancelled``."""

    def __init__(self, job_id: int, interval: float) -> None:
        self.job_id, self.interval = job_id, interval
        self.cancelled = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-job-{job_id}", daemon=True)

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    if worker.beat(self.job_id):
                        self.cancelled.set()
                except Exception:  # a database blip must not end the job; the next beat retries
                    log.warning("heartbeat of job %d failed", self.job_id, exc_info=True)
                    connection.close()
                self._stop.wait(self.interval)
        finally:
            connection.close()


def off_loop(fn: Callable[..., Any], *args: Any) -> Any:
    """Run an ORM call on a fresh thread: the body may call back from inside an asyncio event loop, where
    Django refuses synchronous database access."""
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["value"] = fn(*args)
        except BaseException as exc:
            result["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result.get("value")


def describe_components(config: dict[str, Any]) -> list[tuple[str, str, Any]]:
    """Import the job's tools and reward on this worker and describe the exact versions found."""
    from webapp.registry.introspect import describe

    rollout = config.get("rollout", {})
    found = [("tool", p, describe("tool", p)) for p in rollout.get("tools", [])]
    if rollout.get("reward"):
        found.append(("reward", rollout["reward"], describe("reward", rollout["reward"])))
    return found


def on_checkpoint(job_id: int, sink: Any, step: int, path: str, metrics: dict[str, Any]) -> None:
    off_loop(worker.record_checkpoint, job_id, step, path, metrics)
    # Through the sink, so the log line keeps its place among the trainer's events.
    sink.emit({"type": "log", "step": step, "level": "info", "checkpoint": path,
               "message": f"checkpoint saved at step {step}: {path}"})


def start_nodes(job: TrainingJob, leader: str) -> Any:
    """For a job of ``nodes`` > 1: send one ``run_node`` task per other node to the job's queue, each to
    join this worker's rendezvous, and return this (the first) node; ``None`` for a one-node job."""
    nodes = int(job.config.get("nodes", 1))
    if nodes == 1:
        return None
    from trainer.distributed import free_port
    from webapp.jobs import body

    endpoint = f"{settings.AGENTFLY_NODE_ADDRESS}:{free_port('')}"  # the other hosts connect to it
    for rank in range(1, nodes):
        run_node.apply_async(args=[job.pk, rank, endpoint, leader], queue=job.queue,
                             task_id=f"{job.celery_task_id}-node-{rank}")
    return body.Node(0, nodes, endpoint)


@shared_task(name="webapp.jobs.tasks.run_job", acks_late=True,
             time_limit=settings.JOB_TIME_LIMIT, soft_time_limit=settings.JOB_SOFT_TIME_LIMIT)
def run_job(job_id: int) -> str:
    from webapp.jobs import body
    from webapp.monitor.sink import DatabaseEventSink

    job = TrainingJob.objects.filter(pk=job_id).first()
    if job is None:
        return "gone"
    if not worker.claim_job(job_id):
        return "skipped"
    output_dir = paths.job_dir(job)  # inside the team's folder: AGENTFLY_RUNS_DIR/<team-slug>/job-<id>
    output_dir.mkdir(parents=True, exist_ok=True)
    # The heartbeat runs until the job's row is final (through the final evaluation and checkpoint, and the
    # finish below), so the sweep never mistakes a finishing worker for a dead one.
    heartbeat = Heartbeat(job_id, settings.JOB_HEARTBEAT_SECONDS).start()
    # This task owns the sink and closes it after its last event; the trainer only borrows it (body.Lent).
    sink = DatabaseEventSink(job_id)
    status, error, outcome = Status.FAILED, "", body.Outcome()
    try:
        try:
            from webapp.registry.rules import check_job_config

            check_job_config(job.config, job.team.slug)  # before anything is imported: rows made behind the API too
            paths.check_config(job.config, job.team)  # again here: the config may have been written behind the API
            for warning in worker.record_versions_used(job_id, describe_components(job.config)):
                sink.emit({"type": "log", "level": "warning", "message": warning})
            here = run_job.request.hostname or worker.worker_name()
            node = start_nodes(job, here)
            if node is not None:
                sink.emit({"type": "log", "level": "info", "message": f"node 0 of {node.count} runs on worker "
                                                                      f"{here}; rendezvous at {node.endpoint}"})
            outcome = body.run(
                cluster.with_ray(job.config, job.pk, job.team.slug), kind=job.kind, output_dir=output_dir, sinks=[sink], should_stop=heartbeat.cancelled.is_set,
                node=node,
                on_checkpoint=lambda step, path, metrics: on_checkpoint(job_id, sink, step, path, metrics),
                on_step=lambda step: off_loop(worker.record_progress, job_id, step),
            )
            status = Status.CANCELLED if outcome.cancelled else Status.SUCCEEDED
        except SoftTimeLimitExceeded:
            error = f"the job ran past its time limit of {settings.JOB_SOFT_TIME_LIMIT} s; resume it from its checkpoint"
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            sink.emit({"type": "log", "level": "error", "message": error, "traceback": traceback.format_exc()})
            log.exception("job %d failed", job_id)
        finally:
            sink.close()
        ended = worker.finish_job(job_id, status, error=error, final_metrics=outcome.final_metrics,
                                  step=outcome.last_step)
    finally:
        heartbeat.stop()
        cluster.stop_ray_job(job_id)  # nothing of the job stays on the Ray cluster, however it ended
    return ended or status


@inspect_command()
def agentfly_devices(state: Any) -> dict[str, Any]:
    """Answers ``webapp.jobs.queues.most_ranks`` and ``hosts_with``: the queues this worker consumes, its
    host (the part of its name after ``@``), and its GPUs and CPU cores (what one node's ranks can have)."""
    from webapp.jobs.queues import local_devices

    queues = [q.name for q in state.consumer.task_consumer.queues]
    return {"queues": queues, "host": host_of(state.consumer.hostname), **local_devices()}


@shared_task(name="webapp.jobs.tasks.run_node", bind=True, acks_late=True, max_retries=120,
             time_limit=settings.JOB_TIME_LIMIT, soft_time_limit=settings.JOB_SOFT_TIME_LIMIT)
def run_node(self: Any, job_id: int, node_rank: int, endpoint: str, leader: str) -> str:
    """Node ``node_rank`` (> 0) of a multi-node job: this host's ``torchrun`` joins the first node's
    rendezvous at ``endpoint``. The first node's task (``run_job``) owns the job's row and events; this one
    only runs ranks, and stops them when the job ends. A node belongs on another host than the leader (or
    its ranks would share the leader's devices): a copy taken on the leader's host goes back to the queue."""
    from webapp.jobs import body
    from webapp.monitor.events import append_events

    job = TrainingJob.objects.filter(pk=job_id).first()
    if job is None or job.status != Status.RUNNING:
        return "gone"
    here = self.request.hostname or worker.worker_name()
    if host_of(here) == host_of(leader):
        if self.request.retries >= 120:  # a minute: the leader's rendezvous times out and fails the job
            return "unplaced"
        raise self.retry(countdown=0.5)
    append_events(job_id, [{"type": "log", "level": "info", "step": job.step,
                            "message": f"node {node_rank} of {job.config['nodes']} runs on worker {here}"}])
    output_dir = paths.job_dir(job)

    def job_ended() -> bool:
        return not TrainingJob.objects.filter(pk=job_id, status=Status.RUNNING).exists()

    body.run_node(cluster.with_ray(job.config, job.pk, job.team.slug), output_dir=output_dir, node=body.Node(node_rank, int(job.config["nodes"]), endpoint),
                  job_ended=job_ended)
    return "done"


@shared_task(name="webapp.jobs.tasks.fail_stale_jobs", ignore_result=True)
def fail_stale_jobs() -> list[int]:
    """Beat runs this every few seconds: running jobs whose worker stopped beating end (failed, or cancelled
    when a cancel was pending). Only this task sweeps: reading a job never writes it."""
    ended = worker.sweep_stale_jobs()
    for job_id in ended:  # a worker that died (SIGKILL, OOM) left its job's pools: stop them now
        cluster.stop_ray_job(job_id)
    return ended
