"""Websocket routes. The live dashboard's consumers join the ``job-<id>`` groups that
``webapp.monitor.events.publish`` sends ``{"type": "job.events", ...}`` messages to."""

from __future__ import annotations

from typing import Any

from django.urls import path

from webapp.jobs.consumers import JobEventsConsumer

websocket_urlpatterns: list[Any] = [
    path("ws/jobs/<int:job_id>/", JobEventsConsumer.as_asgi(), name="ws-job-events"),
]
