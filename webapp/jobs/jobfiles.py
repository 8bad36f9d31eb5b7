"""Opening what a job wrote, from the web process or the worker, without following anything the job could
have put in its place.

A job can write its team's runs folder (``AGENTFLY_RUNS_DIR/<team-slug>/``), so a path there is never
resolved by name: ``open_beneath`` walks from the runs folder one component at a time with ``O_NOFOLLOW``
(a symlink anywhere is refused), and ``open_regular`` opens a file in a folder so opened, non-blocking (a FIFO
cannot hang the reader), and keeps it only if it is a regular file with one link (a hard link to a file
elsewhere is refused). Callers read and write through the descriptors they get, and close them.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence

from django.conf import settings


class Unreadable(Exception):
    """The file or folder is missing, or is not a plain one the server may use; the message says which."""


def _component(name: str) -> str:
    if not name or "/" in name or name in (".", "..") or "\0" in name:
        raise Unreadable(f"{name[:80]!r} is not one path component")
    return name


def open_beneath(parts: Sequence[str]) -> int:
    """A descriptor of the folder ``AGENTFLY_RUNS_DIR/<parts...>``, walked without following symlinks."""
    try:  # the runs folder is the operator's (no job writes its parent): opened by name
        fd = os.open(os.fspath(settings.AGENTFLY_RUNS_DIR), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:  # no job has run on this server yet
        raise Unreadable("it does not exist (yet)") from None
    try:
        for part in parts:
            inner = os.open(_component(part), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = inner
    except FileNotFoundError:
        os.close(fd)
        raise Unreadable("it does not exist (yet)") from None
    except OSError as exc:  # ELOOP (a symlink), ENOTDIR: something put there in place of the real folder
        os.close(fd)
        raise Unreadable(f"it cannot be read safely ({os.strerror(exc.errno or 0)})") from None
    return fd


def open_regular(dir_fd: int, name: str) -> int:
    """A read-only descriptor of the plain file ``name`` in the folder ``dir_fd``."""
    try:
        fd = os.open(_component(name), os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_NOFOLLOW | os.O_CLOEXEC,
                     dir_fd=dir_fd)
    except FileNotFoundError:
        raise Unreadable("it does not exist (yet)") from None
    except OSError as exc:
        raise Unreadable(f"it cannot be read safely ({os.strerror(exc.errno or 0)})") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        os.close(fd)
        raise Unreadable("it is not a plain file, so it is not read")
    return fd


def job_parts(job: object) -> list[str]:
    """The job's folder below the runs folder (``webapp.jobs.paths.job_dir``), as components."""
    return [job.team.slug, f"job-{job.pk}"]  # type: ignore[attr-defined]
