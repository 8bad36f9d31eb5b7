"""A job's files as its team reads them from the browser: the training process's output (a tail, what came
after an offset, the whole file as a download). Another team's job is a 404; reading goes through
``webapp.jobs.output``, never a path opened by name."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.shortcuts import get_object_or_404

from webapp.jobs.models import TrainingJob
from webapp.jobs.output import OutputUnavailable, read_output, stream_output


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
def output_download(request: HttpRequest, pk: int) -> HttpResponse:
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
