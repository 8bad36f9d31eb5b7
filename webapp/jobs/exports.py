"""Checkpoints out of the server: a checkpoint's Hugging Face files as a streamed archive, and an export of them
to a folder of the team's own (``AGENTFLY_RUNS_DIR/<team>/exports/job-<id>-step-<n>/``) that
``from_pretrained`` loads and a later job can name as its model.

Only what a model needs is taken (weights as safetensors, config, generation config, tokenizer files, chat
template) and the run's ``config.yaml``; the trainer's state (``trainer_state.pt``, each rank's ``.pt``,
DeepSpeed's folder) stays: it is a pickle and only a resume reads it. The checkpoint's folder is one a job
may write, so everything is opened by descriptor (``webapp.jobs.jobfiles``), read and written there, never
by a path resolved by name; the export is written under a temporary name and renamed into place whole.
"""

from __future__ import annotations

import contextlib
import os
import re
import tarfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from celery import shared_task

from webapp.jobs.jobfiles import Unreadable, job_parts, open_beneath, open_regular

PIECE = 1 << 20
CHECKPOINT_DIR = re.compile(r"checkpoint-\d{6}")
MODEL_FILES = re.compile(
    r"(model(-\d{5}-of-\d{5})?\.safetensors|model\.safetensors\.index\.json|config\.json|generation_config\.json"
    r"|tokenizer\.json|tokenizer_config\.json|special_tokens_map\.json|added_tokens\.json|vocab\.(json|txt)"
    r"|merges\.txt|tokenizer\.model|chat_template\.(jinja|json)|config\.yaml)")
EXPORTS = "exports"


class NotExportable(Exception):
    """The checkpoint cannot be read or exported; the message says why and what to do."""


@dataclass(frozen=True)
class ModelFile:
    name: str
    fd: int
    size: int


def checkpoint_folder(checkpoint: Any) -> str:
    """The checkpoint's folder name inside its job's folder; NotExportable when the row names anything else."""
    name = os.path.basename(str(checkpoint.path).rstrip("/"))
    if not CHECKPOINT_DIR.fullmatch(name) or os.path.dirname(str(checkpoint.path).rstrip("/")).split("/")[-1:] != \
            [f"job-{checkpoint.job_id}"]:
        raise NotExportable(f"checkpoint {checkpoint.path!r} is not a checkpoint folder of its job")
    return name


def open_model_files(checkpoint: Any) -> list[ModelFile]:
    """The checkpoint's model files, opened (the caller closes them with ``close_all``), sorted by name."""
    job = checkpoint.job
    try:
        folder = open_beneath([*job_parts(job), checkpoint_folder(checkpoint)])
    except Unreadable as exc:
        raise NotExportable(f"the checkpoint of step {checkpoint.step} cannot be read: {exc} (the trainer keeps "
                            "only the last few checkpoints and the best one)") from None
    files: list[ModelFile] = []
    try:
        for name in sorted(os.listdir(folder)):
            if MODEL_FILES.fullmatch(name):
                try:
                    fd = open_regular(folder, name)
                except Unreadable as exc:
                    raise NotExportable(f"{name} of the checkpoint of step {checkpoint.step}: {exc}") from None
                files.append(ModelFile(name, fd, os.fstat(fd).st_size))
    except BaseException:
        close_all(files)
        raise
    finally:
        os.close(folder)
    if not any(f.name.endswith(".safetensors") for f in files) or "config.json" not in {f.name for f in files}:
        close_all(files)
        raise NotExportable(f"the checkpoint of step {checkpoint.step} has no safetensors weights or config.json")
    return files


def close_all(files: list[ModelFile]) -> None:
    for f in files:
        os.close(f.fd)


def archive_name(checkpoint: Any) -> str:
    return f"job-{checkpoint.job_id}-step-{checkpoint.step}"


def stream_archive(checkpoint: Any) -> Iterator[bytes]:
    """A tar of the checkpoint's model files under ``job-<id>-step-<n>/``, made as it is sent (a header,
    then the file's bytes a MiB at a time from its descriptor): never held in memory whole."""
    files = open_model_files(checkpoint)
    top = archive_name(checkpoint)

    def pieces() -> Iterator[bytes]:
        try:
            now = time.time()
            for f in files:
                info = tarfile.TarInfo(f"{top}/{f.name}")
                info.size, info.mtime, info.mode = f.size, now, 0o644
                yield info.tobuf(format=tarfile.PAX_FORMAT)
                offset = 0
                while offset < f.size:  # the size fixed in the header: a file that grew is cut, one that shrank fails
                    data = os.pread(f.fd, min(PIECE, f.size - offset), offset)
                    if not data:
                        raise NotExportable(f"{f.name} shrank while it was being sent")
                    offset += len(data)
                    yield data
                if f.size % tarfile.BLOCKSIZE:
                    yield tarfile.NUL * (tarfile.BLOCKSIZE - f.size % tarfile.BLOCKSIZE)
            yield tarfile.NUL * (2 * tarfile.BLOCKSIZE)  # the end of the archive
        finally:
            close_all(files)

    return pieces()


def export_path(checkpoint: Any) -> str:
    """Where the export lies, as a job's config names it (``model.path``)."""
    from webapp.jobs.paths import team_dir

    return str(team_dir(checkpoint.job.team) / EXPORTS / archive_name(checkpoint))


def _open_or_make(dir_fd: int, name: str) -> int:
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, 0o755, dir_fd=dir_fd)
    try:
        return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as exc:
        raise NotExportable(f"the team's {name}/ folder cannot be used ({os.strerror(exc.errno or 0)}); remove "
                            "whatever is there in its place") from None


def is_exported(checkpoint: Any) -> bool:
    """Whether the export's folder is there with its config (looked at by descriptor, like everything else)."""
    try:
        folder = open_beneath([checkpoint.job.team.slug, EXPORTS, archive_name(checkpoint)])
    except Unreadable:
        return False
    try:
        os.close(open_regular(folder, "config.json"))
        return True
    except Unreadable:
        return False
    finally:
        os.close(folder)


def export_checkpoint(checkpoint: Any) -> str:
    """Copy the checkpoint's model files into the team's ``exports/job-<id>-step-<n>/``; return that path.
    An earlier export of the same checkpoint is replaced."""
    files = open_model_files(checkpoint)
    try:
        team = open_beneath([checkpoint.job.team.slug])
    except Unreadable as exc:
        close_all(files)
        raise NotExportable(f"the team's folder cannot be used: {exc}") from None
    try:
        exports = _open_or_make(team, EXPORTS)
        try:
            partial = f".{archive_name(checkpoint)}.{uuid.uuid4().hex[:8]}.partial"
            os.mkdir(partial, 0o755, dir_fd=exports)
            target = os.open(partial, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=exports)
            try:
                for f in files:
                    out = os.open(f.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                                  dir_fd=target)
                    try:
                        offset = 0
                        while offset < f.size:
                            data = os.pread(f.fd, min(PIECE, f.size - offset), offset)
                            if not data:
                                raise NotExportable(f"{f.name} shrank while it was being copied")
                            offset += len(data)
                            os.write(out, data)
                    finally:
                        os.close(out)
            finally:
                os.close(target)
            _replace(exports, partial, archive_name(checkpoint))
        finally:
            os.close(exports)
    finally:
        os.close(team)
        close_all(files)
    return export_path(checkpoint)


def _replace(exports: int, partial: str, name: str) -> None:
    """Rename the finished copy into place; an older export of the same name is moved aside and removed."""
    old = f".{name}.{uuid.uuid4().hex[:8]}.old"
    try:
        os.rename(name, old, src_dir_fd=exports, dst_dir_fd=exports)
    except FileNotFoundError:
        old = ""
    os.rename(partial, name, src_dir_fd=exports, dst_dir_fd=exports)
    if old:
        _remove_tree(exports, old)


def _remove_tree(dir_fd: int, name: str) -> None:
    try:
        inner = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except NotADirectoryError:
        os.unlink(name, dir_fd=dir_fd)
        return
    except OSError:  # a symlink: unlink the link itself, never what it points to
        os.unlink(name, dir_fd=dir_fd)
        return
    try:
        for entry in os.listdir(inner):
            _remove_tree(inner, entry)
    finally:
        os.close(inner)
    os.rmdir(name, dir_fd=dir_fd)


@shared_task(name="webapp.jobs.exports.export_checkpoint_task", acks_late=False, reject_on_worker_lost=False)
def export_checkpoint_task(checkpoint_id: int) -> dict[str, Any]:
    """The export on a worker (copying gigabytes is no work for a web request): ``{"checkpoint", "path"}`` or
    ``{"checkpoint", "error"}``."""
    from webapp.jobs.models import Checkpoint

    checkpoint = Checkpoint.objects.select_related("job__team").filter(pk=checkpoint_id).first()
    if checkpoint is None:
        return {"checkpoint": checkpoint_id, "error": "the checkpoint no longer exists"}
    try:
        return {"checkpoint": checkpoint_id, "path": export_checkpoint(checkpoint)}
    except NotExportable as exc:
        return {"checkpoint": checkpoint_id, "error": str(exc)}
