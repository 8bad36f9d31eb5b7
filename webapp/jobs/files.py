"""A job's files as its team reads them: the training process's output (a tail, what came after an offset, the
whole file as a download), and its checkpoints (an archive of the model files, an export to a Hugging Face
folder), as pages and API. Another team's job is a 404; reading goes through ``webapp.jobs.output`` and
``webapp.jobs.exports``, never a path opened by name."""

from __future__ import annotations

from typing import Any

from celery.exceptions import TimeoutError as CeleryTimeout
from celery.result import AsyncResult
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.http import require_POST
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response

from webapp.accounts.throttling import throttle
from webapp.celery import app as celery_app
from webapp.jobs import exports
from webapp.jobs.models import Checkpoint, TrainingJob
from webapp.jobs.output import OutputUnavailable, read_output, stream_output
from webapp.schema import detail_response


@login_required
def output(request: HttpRequest, pk: int) -> HttpResponse:
    """``{"text", "start", "end", "size", "live"}``: the last 64 KiB, or with ``?after=N`` what came after byte N
    (the page's follow mode asks for it every few seconds while the job is active)."""
    job = get_object_or_404(TrainingJob.objects.visible_to(request.user).select_related("team"), pk=pk)
    raw = request.GET.get("after", "")
    if raw and not raw.isdigit():
        return JsonResponse({"detail": "after must be a byte offset (a whole number ≥ 0)"}, status=400)
    try:
        chunk = read_output(job, int(raw) if raw else None)
    except OutputUnavailable as exc:
        return JsonResponse({"text": "", "start": 0, "end": 0, "size": 0, "live": job.is_active,
                             "detail": str(exc)})
    return JsonResponse({"text": chunk.text, "start": chunk.start, "end": chunk.end, "size": chunk.size,
                         "live": job.is_active})


@login_required
def output_download(request: HttpRequest, pk: int) -> HttpResponseBase:
    """The whole output as a plain-text attachment, streamed (never rendered by the browser as a page)."""
    job = get_object_or_404(TrainingJob.objects.visible_to(request.user).select_related("team"), pk=pk)
    try:
        pieces = stream_output(job)
    except OutputUnavailable as exc:
        return HttpResponse(f"{exc}\n", status=404, content_type="text/plain; charset=utf-8")
    response = StreamingHttpResponse(pieces, content_type="text/plain; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="job-{job.pk}-output.log"'
    response["X-Content-Type-Options"] = "nosniff"
    return response


def output_context(job: TrainingJob) -> dict[str, object]:
    """The output card's first render: the tail, or why there is none."""
    try:
        return {"output": read_output(job), "output_missing": ""}
    except OutputUnavailable as exc:
        return {"output": None, "output_missing": str(exc)}


# ------------------------------------------------------------------------------------------ checkpoints out
def team_checkpoint(user: object, pk: int, step: int) -> Checkpoint:
    """The checkpoint of step ``step`` of job ``pk``, if ``user``'s team owns the job; 404 otherwise."""
    return get_object_or_404(Checkpoint.objects.select_related("job__team"),
                             job__in=TrainingJob.objects.visible_to(user), job_id=pk, step=step)


def archive_response(checkpoint: Checkpoint, *, api: bool = False) -> HttpResponseBase:
    try:
        pieces = exports.stream_archive(checkpoint)
    except exports.NotExportable as exc:
        if api:
            return JsonResponse({"detail": str(exc)}, status=404)
        return HttpResponse(f"{exc}\n", status=404, content_type="text/plain; charset=utf-8")
    response = StreamingHttpResponse(pieces, content_type="application/x-tar")
    response["Content-Disposition"] = f'attachment; filename="{exports.archive_name(checkpoint)}.tar"'
    return response


def queue_export(checkpoint: Checkpoint) -> Any:
    return exports.export_checkpoint_task.apply_async(args=[checkpoint.pk], queue="cpu")


@login_required
def checkpoint_archive(request: HttpRequest, pk: int, step: int) -> HttpResponseBase:
    """The checkpoint's model files as a tar, streamed."""
    return archive_response(team_checkpoint(request.user, pk, step))


# How long the page waits for an export before saying it goes on in the background.
EXPORT_WAIT_S = 20


@login_required
@require_POST
@throttle("launch")
def checkpoint_export(request: HttpRequest, pk: int, step: int) -> HttpResponse:
    """Export the checkpoint to the team's folder on a worker; wait a little for it, then say where it is."""
    checkpoint = team_checkpoint(request.user, pk, step)
    pending = queue_export(checkpoint)
    try:
        result = pending.get(timeout=EXPORT_WAIT_S, propagate=False)
    except CeleryTimeout:
        messages.info(request, f"Exporting step {step} to {exports.export_path(checkpoint)} goes on on a worker; "
                               "it is listed here when it is done.")
    else:
        if isinstance(result, dict) and result.get("path"):
            messages.success(request, f"Step {step} is exported to {result['path']}: load it with "
                                      "from_pretrained, or name it as a job's model path.")
        else:
            error = result.get("error") if isinstance(result, dict) else repr(result)
            messages.error(request, f"The export of step {step} failed: {error}")
    return redirect(f"{checkpoint.job.get_absolute_url()}#checkpoints-out")


def checkpoints_context(job: TrainingJob, user: object) -> dict[str, object]:
    """The "Checkpoints out" card: each checkpoint, and whether it is exported (and where)."""
    rows = [{"checkpoint": c, "exported": exports.is_exported(c), "path": exports.export_path(c)}
            for c in job.checkpoints.all()]
    return {"checkpoints_out": rows, "can_export": job.team.has_member(user)}


@extend_schema(responses={(200, "application/x-tar"): OpenApiTypes.BINARY,
                          404: detail_response("No such checkpoint of a job of your teams, or it is gone.")})
@api_view(["GET"])
def api_checkpoint_archive(request: Request, pk: int, step: int) -> HttpResponseBase:
    """The checkpoint's model files (safetensors, config, tokenizer, chat template) as a tar, streamed."""
    return archive_response(team_checkpoint(request.user, pk, step), api=True)


@extend_schema(request=None, responses={
    200: inline_serializer("ExportState", {"exported": serializers.BooleanField(), "path": serializers.CharField(),
                                          "error": serializers.CharField(required=False)}),
    202: inline_serializer("ExportQueued", {"task": serializers.CharField(), "path": serializers.CharField()})})
@api_view(["GET", "POST"])
def api_checkpoint_export(request: Request, pk: int, step: int) -> Response:
    """POST: export the checkpoint to a Hugging Face folder in the team's folder on a worker (202: where it will
    be). GET: whether it is there; with ``?task=<id>`` of that POST, the error if the export failed."""
    checkpoint = team_checkpoint(request.user, pk, step)
    path = exports.export_path(checkpoint)
    if request.method == "POST":
        return Response({"task": queue_export(checkpoint).id, "path": path}, status=202)
    answer: dict[str, Any] = {"exported": exports.is_exported(checkpoint), "path": path}
    task = request.query_params.get("task", "")
    if task:
        result = AsyncResult(task, app=celery_app).result
        if isinstance(result, dict) and result.get("checkpoint") == checkpoint.pk and result.get("error"):
            answer["error"] = result["error"]
    return Response(answer)
