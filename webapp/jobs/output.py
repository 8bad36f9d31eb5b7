"""The training process's own output (its stdout and stderr, as the worker captured them), read for the job
page: a tail, what came after a byte offset, or the whole file as a download.

The folder holding the file is one a job may write (its team's folder), so it is opened through
``webapp.jobs.jobfiles`` (no symlink followed, no FIFO or hard link read); every read is through that
descriptor and bounded. ``open_output`` is the one place that knows where the output lives.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from webapp.jobs.jobfiles import Unreadable, job_parts, open_beneath, open_regular

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


def open_output(job: Any) -> int:
    """A read-only descriptor of ``job``'s output file (the caller closes it); OutputUnavailable otherwise.
    The one place that knows where the output lives."""
    try:
        folder = open_beneath(job_parts(job))
    except Unreadable as exc:
        raise OutputUnavailable(_missing(exc)) from None
    try:
        return open_regular(folder, OUTPUT_NAME)
    except Unreadable as exc:
        raise OutputUnavailable(_missing(exc)) from None
    finally:
        os.close(folder)


def _missing(exc: Unreadable) -> str:
    text = str(exc)
    return "the training process has written no output yet" if "does not exist" in text else f"the output: {text}"


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
