"""The Celery tasks of jobs: ``run_job`` (the training task) and ``fail_stale_jobs`` (the heartbeat sweep).

``run_job`` takes an id, re-fetches the row and claims it with a conditional update; a message for a job
that is gone, cancelled or already claimed (a redelivery after ``acks_late``) returns quietly. While the
body runs, a heartbeat thread stamps the row and reads the cancel flag, which the body checks between steps.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any

from celery import shared_task
from celery.exceptions import SoftTimeLimitExceeded
from celery.worker.control import inspect_command
from django.conf import settings
from django.db import connection
from django.utils import timezone

from trainer.events import Event, log_event
from webapp.jobs import apis, cluster, paths, servers, worker
from webapp.jobs.models import Status, TrainingJob
from webapp.jobs.queues import host_of
from webapp.mcpservers import jobs as mcp_jobs

log = logging.getLogger(__name__)


class Heartbeat:
    """Stamps the job alive every ``JOB_HEARTBEAT_SECONDS`` and decides when it must stop between steps:
    a cancel (``cancelled``), its team's time quota (``over_time`` says why), or its turn to yield the worker
    to another team's waiting job (``yielding``). ``stop_requested`` is any of them."""

    def __init__(self, job_id: int, interval: float) -> None:
        self.job_id, self.interval = job_id, interval
        self.cancelled = threading.Event()
        self.yielding = threading.Event()
        self.over_time: str | None = None
        self.first_step_at: datetime | None = None  # this run's first trained step: the time slice counts from it
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-job-{job_id}", daemon=True)

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def stepped(self) -> None:
        """A step of this run was trained."""
        if self.first_step_at is None:
            self.first_step_at = timezone.now()

    def stop_requested(self) -> bool:
        return self.cancelled.is_set() or self.yielding.is_set() or self.over_time is not None

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    if worker.beat(self.job_id):
                        self.cancelled.set()
                    if self.over_time is None:
                        self.over_time = worker.over_time(self.job_id)
                    if not self.yielding.is_set() and worker.must_yield(self.job_id, self.first_step_at):
                        worker.mark_yielding(self.job_id)  # first, so the pages never say running while it yields
                        self.yielding.set()
                except Exception:  # a database blip must not end the job; the next beat retries
                    log.warning("heartbeat of job %d failed", self.job_id, exc_info=True)
                    connection.close()
                self._stop.wait(self.interval)
        finally:
            connection.close()


class Yielding:
    """The job's sink while it may yield: the trainer ends a stopped run with a ``cancelled`` status, which
    for a job that yields (or ran out of time) is not the job's end; it is stored as a log line, and the
    worker writes the job's real state (preempted, failed) after it."""

    def __init__(self, sink: Any, heartbeat: Heartbeat) -> None:
        self.sink, self.heartbeat = sink, heartbeat

    def emit(self, event: Event) -> None:
        if (event["type"] == "status" and event["data"]["state"] == "cancelled"
                and (self.heartbeat.yielding.is_set() or self.heartbeat.over_time) and not self.heartbeat.cancelled.is_set()):
            event = log_event(event["step"], "stopped at a checkpoint", run=event["run"], at=event["time"])
        self.sink.emit(event)

    def close(self) -> None:
        pass


def config_to_run(job: TrainingJob) -> dict[str, Any]:
    """The job's stored config as this worker runs it: its MCP servers as the rule allows them now, its
    inference and judge servers as the operator's settings allow them now, its APIs on its team's budgets
    within the quotas as they are now, and its pools (if it has any) on the operator's Ray cluster when there is
    one."""
    config = apis.for_job(servers.for_job(mcp_jobs.for_job(job.config, job.team), job.team.slug), job.team)
    return cluster.with_ray(config, job.pk, job.team.slug, declared=job.declared_resources())


def on_step(job_id: int, heartbeat: Heartbeat, step: int) -> None:
    """A step was trained: the time slice starts at the run's first, and the job's row shows the step."""
    heartbeat.stepped()
    off_loop(worker.record_progress, job_id, step)


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


def describe_components(config: dict[str, Any], team_slug: str) -> list[tuple[str, str, Any]]:
    """Import the job's tools and reward in a child process (never in the worker, which holds the server's
    secrets) and describe the exact versions found."""
    from webapp.registry.child import describe_in_child
    from webapp.registry.rules import check_registrable

    rollout = config.get("rollout", {})
    wanted = [("tool", p) for p in rollout.get("tools", [])]
    if rollout.get("reward"):
        wanted.append(("reward", rollout["reward"]))
    return [(kind, path, describe_in_child(kind, path, check_registrable(kind, path, team_slug), team_slug))
            for kind, path in wanted]


def on_checkpoint(job_id: int, sink: Any, step: int, path: str, metrics: dict[str, Any]) -> None:
    off_loop(worker.record_checkpoint, job_id, step, path, metrics)
    # Through the sink, so the log line keeps its place among the trainer's events.
    sink.emit(log_event(step, f"checkpoint saved at step {step}: {path}", checkpoint=path))


def start_nodes(job: TrainingJob, leader: str) -> Any:
    """For a job of ``nodes`` > 1: send one ``run_node`` task per other node to the job's queue, each to
    join this worker's rendezvous, and return this (the first) node; ``None`` for a one-node job."""
    nodes = job.nodes
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
    from webapp.jobs import isolation
    from webapp.monitor.sink import DatabaseEventSink

    job = TrainingJob.objects.filter(pk=job_id).first()
    if job is None:
        return "gone"
    if not worker.claim_job(job_id):
        return "skipped"
    job.refresh_from_db()  # a preempted job's config now resumes from its checkpoint
    output_dir = paths.job_dir(job)  # inside the team's folder: AGENTFLY_RUNS_DIR/<team-slug>/job-<id>
    output_dir.mkdir(parents=True, exist_ok=True)
    # The heartbeat runs until the job's row is final (through the final evaluation and checkpoint, and the
    # finish below), so the sweep never mistakes a finishing worker for a dead one.
    heartbeat = Heartbeat(job_id, settings.JOB_HEARTBEAT_SECONDS).start()
    # This task owns the sink and closes it after its last event; the training process's events reach it
    # through the worker (webapp.jobs.isolation), which checks each one.
    sink = DatabaseEventSink(job_id)
    status, error, outcome = Status.FAILED, "", None
    try:
        try:
            from webapp.registry.rules import check_job_config

            check_job_config(job.config, job.team.slug)  # before anything is imported: rows made behind the API too
            paths.check_config(job.config, job.team, job.resume_from)  # again: it may have been written behind the API
            for warning in worker.record_versions_used(job_id, describe_components(job.config, job.team.slug)):
                sink.emit(log_event(job.step, warning, "warning"))
            here = run_job.request.hostname or worker.worker_name()
            node = start_nodes(job, here)
            if node is not None:
                sink.emit(log_event(job.step, f"node 0 of {node.count} runs on worker {here}; rendezvous at "
                                              f"{node.endpoint}"))
            config = config_to_run(job)
            with apis.credential(job, config) as env:
                outcome = isolation.run_job(
                    job, config, output_dir=output_dir, env=env,
                    sinks=[Yielding(sink, heartbeat)],
                    should_stop=heartbeat.stop_requested, node=node,
                    on_checkpoint=lambda step, path, metrics: on_checkpoint(job_id, sink, step, path, metrics),
                    on_step=lambda step: on_step(job_id, heartbeat, step),
                )
            status = Status.CANCELLED if outcome.cancelled else Status.SUCCEEDED
            if outcome.cancelled and not heartbeat.cancelled.is_set():
                if heartbeat.over_time:
                    status, error = Status.FAILED, heartbeat.over_time
                elif heartbeat.yielding.is_set():
                    status = worker.preempt_job(job_id, outcome.last_step, enqueue_again) or Status.FAILED
                    if status == Status.FAILED:
                        error = ("the job stopped to yield its worker to another team's job but has no checkpoint "
                                 "to resume from; launch it again")
        except SoftTimeLimitExceeded:
            error = f"the job ran past its time limit of {settings.JOB_SOFT_TIME_LIMIT} s; resume it from its checkpoint"
        except Exception as exc:
            error, trace = isolation.format_failure(exc)
            sink.emit(log_event(job.step, error, "error", traceback=trace))
            log.exception("job %d failed", job_id)
        finally:
            sink.close()
        if status == Status.PREEMPTED:
            return str(status)
        ended = worker.finish_job(job_id, status, error=error,
                                  final_metrics=outcome.final_metrics if outcome else {},
                                  step=outcome.last_step if outcome else 0)
    finally:
        heartbeat.stop()
        cluster.stop_ray_job(job_id)  # nothing of the job stays on the Ray cluster, however it ended
    return ended or status


def enqueue_again(job: TrainingJob) -> None:
    """A preempted job's next run: at the back of its queue, behind the jobs that waited for it. A task id
    of its own (the current task is still running under the job's); a cancel needs no revoke, since the
    claim refuses a cancelled job."""
    run_job.apply_async(args=[job.pk], queue=job.queue,
                        task_id=f"{job.celery_task_id}-run-{int(job.queued_at.timestamp() * 1000)}")  # type: ignore[union-attr]  # queued


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
    from webapp.jobs import body, isolation
    from webapp.monitor.events import append_events

    job = TrainingJob.objects.filter(pk=job_id).first()
    if job is None or job.status != Status.RUNNING:
        return "gone"
    here = self.request.hostname or worker.worker_name()
    if host_of(here) == host_of(leader):
        if self.request.retries >= 120:  # a minute: the leader's rendezvous times out and fails the job
            return "unplaced"
        raise self.retry(countdown=0.5)
    append_events(job_id, [log_event(job.step, f"node {node_rank} of {job.nodes} runs on worker {here}")])
    output_dir = paths.job_dir(job)

    def job_ended() -> bool:
        return not TrainingJob.objects.filter(pk=job_id, status=Status.RUNNING).exists()

    config = config_to_run(job)
    with apis.credential(job, config, first=False) as env:  # the leader's run holds its own password
        isolation.run_node(job, config, output_dir=output_dir, env=env,
                           node=body.Node(node_rank, job.nodes, endpoint), job_ended=job_ended)
    return "done"


@shared_task(name="webapp.jobs.tasks.cap_team_redis", ignore_result=True)
def cap_team_redis() -> list[str]:
    """Beat runs this every few seconds: a team whose Redis keys outgrow AGENTFLY_TEAM_REDIS_MAX_BYTES is cut
    off (``webapp.jobs.apis.cap_team_redis``)."""
    from webapp.jobs import apis

    return apis.cap_team_redis()


@shared_task(name="webapp.jobs.tasks.fail_stale_jobs", ignore_result=True)
def fail_stale_jobs() -> list[int]:
    """Beat runs this every few seconds: running jobs whose worker stopped beating end (failed, or cancelled
    when a cancel was pending). Only this task sweeps: reading a job never writes it."""
    ended = worker.sweep_stale_jobs()
    for job_id in ended:  # a worker that died (SIGKILL, OOM) left its job's pools: stop them now
        cluster.stop_ray_job(job_id)
    return ended
