"""The alerts' tasks, on the ``alerts`` queue (``celery -A webapp worker -Q alerts``; beat runs the scan).

``scan_for_alerts`` looks at the jobs every few seconds: a job that failed or succeeded after a rule was made,
or a running job whose newest step is older than the rule's ``stall_minutes``, gets one ``AlertDelivery`` per
rule and event (a unique constraint, so two scans at once cannot alert twice). ``deliver_alert`` sends one,
retried with exponential backoff on a failed POST; a refused URL is not retried. Neither touches the job.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from celery import shared_task
from django.conf import settings
from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.db.models import Max
from django.utils import timezone

from webapp.alerts.models import AlertDelivery, AlertRule, DeliveryStatus, Event
from webapp.alerts.webhooks import DeliveryFailed, WebhookRefused, post_json

MAX_ATTEMPTS = 6


def _new_delivery(rule: AlertRule, job: Any, event: str) -> None:
    try:
        with transaction.atomic():
            delivery = AlertDelivery.objects.create(rule=rule, job=job, event=event)
    except IntegrityError:  # already alerted (or another scan just did)
        return
    transaction.on_commit(lambda: deliver_alert.apply_async(args=[delivery.pk], queue="alerts"))


@shared_task(name="webapp.alerts.tasks.scan_for_alerts", acks_late=False)
def scan_for_alerts() -> int:
    """Make the deliveries the jobs' states call for; returns how many rules were looked at."""
    from webapp.jobs.models import Status, TrainingJob
    from webapp.monitor.models import JobEvent

    rules = list(AlertRule.objects.select_related("team"))
    now = timezone.now()
    for rule in rules:
        done = AlertDelivery.objects.filter(rule=rule)
        for event, status in ((Event.FAILED, Status.FAILED), (Event.FINISHED, Status.SUCCEEDED)):
            if event in rule.events:
                jobs = (TrainingJob.objects.filter(team=rule.team, status=status, finished_at__gte=rule.created_at)
                        .exclude(pk__in=done.filter(event=event).values("job_id")))
                for job in jobs[:100]:
                    _new_delivery(rule, job, event)
        if Event.STALLED in rule.events:
            quiet_since = now - timedelta(minutes=rule.stall_minutes)
            running = (TrainingJob.objects.filter(team=rule.team, status=Status.RUNNING,
                                                  run_started_at__lte=quiet_since)
                       .exclude(pk__in=done.filter(event=Event.STALLED).values("job_id")))
            for job in running[:100]:
                last = JobEvent.objects.filter(job=job, type="metrics").aggregate(t=Max("time"))["t"]
                if last is None or last <= quiet_since.timestamp():
                    _new_delivery(rule, job, Event.STALLED)
    return len(rules)


def message(delivery: AlertDelivery) -> dict[str, Any]:
    """The webhook's JSON body (and the mail's text): what happened to which job, and where to look."""
    job = delivery.job
    base = settings.AGENTFLY_SITE_URL.rstrip("/")
    what = {Event.FAILED: f"failed: {job.error[:500]}" if job.error else "failed",
            Event.STALLED: f"has made no step for {delivery.rule.stall_minutes} minutes (at step {job.step})",
            Event.FINISHED: f"finished at step {job.step}"}[Event(delivery.event)]
    return {"event": delivery.event, "team": delivery.rule.team.slug, "job": {"id": job.pk, "name": job.name,
            "status": job.status, "step": job.step, "url": f"{base}/jobs/{job.pk}/" if base else f"/jobs/{job.pk}/"},
            "text": f"AgentFly job #{job.pk} {job.name!r} {what}", "time": time.time()}


@shared_task(name="webapp.alerts.tasks.deliver_alert", bind=True, acks_late=False, max_retries=MAX_ATTEMPTS - 1)
def deliver_alert(self: Any, delivery_id: int) -> str:
    """Send one alert by webhook (and mail); retry a failed POST with backoff, record the outcome."""
    delivery = AlertDelivery.objects.select_related("rule__team", "job").filter(pk=delivery_id).first()
    if delivery is None or delivery.status != DeliveryStatus.PENDING:
        return "gone"
    AlertDelivery.objects.filter(pk=delivery_id).update(attempts=self.request.retries + 1)
    body = message(delivery)
    try:
        if delivery.rule.webhook_url:
            post_json(delivery.rule.webhook_url, body)
        if delivery.rule.email and settings.EMAIL_HOST:
            send_mail(f"[AgentFly] job #{delivery.job_id} {delivery.event}", body["text"] + "\n" + body["job"]["url"],
                      settings.DEFAULT_FROM_EMAIL, [delivery.rule.email])
    except WebhookRefused as exc:  # the rule's URL is not allowed (any more): retrying cannot help
        AlertDelivery.objects.filter(pk=delivery_id).update(status=DeliveryStatus.FAILED, error=str(exc)[:2000])
        return "refused"
    except (DeliveryFailed, OSError) as exc:
        AlertDelivery.objects.filter(pk=delivery_id).update(error=str(exc)[:2000])
        if self.request.retries + 1 >= MAX_ATTEMPTS:
            AlertDelivery.objects.filter(pk=delivery_id).update(status=DeliveryStatus.FAILED)
            return "failed"
        raise self.retry(countdown=settings.AGENTFLY_ALERT_RETRY_S * 2 ** self.request.retries) from None
    AlertDelivery.objects.filter(pk=delivery_id).update(status=DeliveryStatus.SENT, error="", sent_at=timezone.now())
    return "sent"
