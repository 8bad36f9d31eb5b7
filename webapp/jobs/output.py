"""The training process's own output (its stdout and stderr, as the worker captured them), read for the job
page: a tail, what came after a byte offset, or the whole file as a download.

The folder holding the file is one a job may write (its team's folder), so the web process never resolves a
path there by name: ``open_output`` walks from the runs folder one component at a time with ``O_NOFOLLOW``
(a symlink anywhere is refused, not followed), opens the file non-blocking (a FIFO put in its place cannot
hang a request), and uses it only if it is a regular file with one link. Every read is through that
descriptor and bounded. ``open_output`` is the one place that knows where the output lives.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from django.conf import settings

OUTPUT_NAME = "process.log"
CHUNK = 64 * 1024  # the most one page load or poll returns; the download streams in pieces of this size
# Terminal control sequences (colours, cursor moves of progress bars): shown as text they are noise.
CONTROL = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


class OutputUnavailable(Exception):
    """The output is not there (yet), or is not a plain file the web process may read."""


@dataclass(frozen=True)
class OutputChunk:
    """``text`` is the output's bytes ``start``..``end`` of ``size`` (decoded, control sequences removed)."""

    text: str
    start: int
    end: int
    size: int

    @property
    def shown(self) -> int:
        return self.end - self.start


def _open_at(dir_fd: int | None, name: str, flags: int) -> int:
    if "/" in name or name in ("", ".", ".."):
        raise OutputUnavailable(f"{name!r} is not one path component")
    return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)


def open_output(job: Any) -> int:
    """A read-only descriptor of ``job``'s output file (the caller closes it); OutputUnavailable otherwise."""
    root = os.open(os.fspath(settings.AGENTFLY_RUNS_DIR), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    fds = [root]
    try:
        for part in (job.team.slug, f"job-{job.pk}"):
            fds.append(_open_at(fds[-1], part, os.O_RDONLY | os.O_DIRECTORY))
        fd = _open_at(fds[-1], OUTPUT_NAME, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except FileNotFoundError:
        raise OutputUnavailable("the training process has written no output yet") from None
    except OSError as exc:  # ELOOP (a symlink), ENOTDIR: something a job put there in place of the real thing
        raise OutputUnavailable(f"the output cannot be read safely ({os.strerror(exc.errno or 0)})") from None
    finally:
        for opened in fds:
            os.close(opened)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        os.close(fd)
        raise OutputUnavailable("the output is not a plain file; it is not shown")
    return fd


def _decode(data: bytes) -> str:
    return CONTROL.sub("", data.decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n"))


def _utf8_end(data: bytes) -> int:
    """The length of ``data`` without a multi-byte character cut at its end (the next read starts with it)."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # a leading or single byte: is its sequence complete?
            need = 1 if byte < 0x80 else 2 if byte >> 5 == 0b110 else 3 if byte >> 4 == 0b1110 else 4
            return len(data) - back if need > back else len(data)
    return len(data)


def read_output(job: Any, after: int | None = None, limit: int = CHUNK) -> OutputChunk:
    """The output after byte ``after`` (at most ``limit`` bytes), or its last ``limit`` bytes when ``after`` is
    None. A file shorter than ``after`` (a new run of the job rewrote it) is read from its start."""
    fd = open_output(job)
    try:
        size = os.fstat(fd).st_size
        if after is None or after > size:
            start = max(0, size - limit) if after is None else 0
        else:
            start = after
        data = os.pread(fd, min(limit, size - start), start)
    finally:
        os.close(fd)
    if after is None and start > 0:  # a tail may begin inside a character: start at the next one
        skip = next((i for i, b in enumerate(data[:4]) if b & 0xC0 != 0x80), 0)
        data, start = data[skip:], start + skip
    data = data[:_utf8_end(data)]  # the rest of a character still being written comes with the next read
    return OutputChunk(_decode(data), start, start + len(data), size)


def stream_output(job: Any) -> Iterator[bytes]:
    """The whole output as it is now, through one descriptor, in pieces of CHUNK bytes (for a download)."""
    fd = open_output(job)

    def pieces() -> Iterator[bytes]:
        try:
            size, offset = os.fstat(fd).st_size, 0
            while offset < size:
                data = os.pread(fd, min(CHUNK, size - offset), offset)
                if not data:
                    return
                offset += len(data)
                yield data
        finally:
            os.close(fd)

    return pieces()
