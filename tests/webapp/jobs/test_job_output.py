"""The training process's output on the job page: the tail rendered escaped, what came after an offset (never
a character cut in two), the whole file as a download, and nothing read through a symlink, FIFO or hard link
a job could put in its place. Another team's job's output is a 404."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from webapp.jobs import paths
from webapp.jobs.output import CHUNK


@pytest.fixture
def job(alice: Any, team_a: Any, runs_dir: Path) -> Any:
    from webapp.jobs.models import TrainingJob

    return TrainingJob.objects.create(team=team_a, created_by=alice, name="printing", status="running",
                                      config={"steps": 2})


def write_output(job: Any, data: bytes) -> Path:
    folder = paths.job_dir(job)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "process.log").write_bytes(data)
    return folder / "process.log"


def test_the_job_page_shows_the_output_escaped_and_without_terminal_colours(alice_client: Any, job: Any) -> None:
    write_output(job, b"step 1 loss 0.5\n\x1b[31m<script>alert(1)</script>\x1b[0m\n")
    page = alice_client.get(f"/jobs/{job.pk}/").content.decode()
    assert "step 1 loss 0.5\n&lt;script&gt;alert(1)&lt;/script&gt;\n</pre>" in page
    assert "\x1b" not in page


def test_following_returns_only_what_came_after_the_offset_and_never_half_a_character(
        alice_client: Any, job: Any) -> None:
    log = write_output(job, b"first\n")
    first = alice_client.get(f"/jobs/{job.pk}/output/").json()
    assert (first["text"], first["end"], first["live"]) == ("first\n", 6, True)
    with log.open("ab") as f:
        f.write("ü".encode()[:1])  # the worker has written half of "ü" so far
    half = alice_client.get(f"/jobs/{job.pk}/output/?after=6").json()
    assert (half["text"], half["end"]) == ("", 6)
    with log.open("ab") as f:
        f.write("ü".encode()[1:] + b" second\n")
    rest = alice_client.get(f"/jobs/{job.pk}/output/?after=6").json()
    assert rest["text"] == "ü second\n" and rest["end"] == rest["size"]
    assert alice_client.get(f"/jobs/{job.pk}/output/?after=-1").status_code == 400


def test_a_large_output_is_read_a_bounded_chunk_at_a_time_and_downloaded_whole(alice_client: Any, job: Any) -> None:
    data = b"".join(b"line %06d\n" % i for i in range(3 * CHUNK // 12))
    write_output(job, data)
    tail = alice_client.get(f"/jobs/{job.pk}/output/").json()
    assert tail["end"] == len(data) and tail["end"] - tail["start"] <= CHUNK
    assert data.decode().endswith(tail["text"])
    first = alice_client.get(f"/jobs/{job.pk}/output/?after=0").json()
    assert first["end"] == CHUNK and first["text"] == data[:CHUNK].decode()
    download = alice_client.get(f"/jobs/{job.pk}/output.log")
    assert download["Content-Disposition"] == f'attachment; filename="job-{job.pk}-output.log"'
    assert download["Content-Type"].startswith("text/plain")
    assert b"".join(download.streaming_content) == data


def test_a_symlink_a_job_puts_in_place_of_its_output_or_its_folder_is_not_followed(
        alice_client: Any, job: Any, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("the worker's secret\n")
    log = write_output(job, b"")
    log.unlink()
    log.symlink_to(secret)
    for url in (f"/jobs/{job.pk}/output/", f"/jobs/{job.pk}/output.log", f"/jobs/{job.pk}/"):
        assert "the worker's secret" not in alice_client.get(url).content.decode()
    assert "cannot be read safely" in alice_client.get(f"/jobs/{job.pk}/output/").json()["detail"]
    folder = paths.job_dir(job)
    os.unlink(log)
    folder.rmdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "process.log").write_text("the worker's secret\n")
    folder.symlink_to(tmp_path / "elsewhere")
    assert "the worker's secret" not in alice_client.get(f"/jobs/{job.pk}/output/").content.decode()


def test_a_hard_link_or_a_fifo_in_place_of_the_output_is_refused_without_waiting(
        alice_client: Any, job: Any, tmp_path: Path) -> None:
    log = write_output(job, b"")
    log.unlink()
    os.mkfifo(log)
    def hung(*_: Any) -> None:
        raise AssertionError("reading a FIFO hung the request")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(10)
    try:
        result = alice_client.get(f"/jobs/{job.pk}/output/").json()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert "not a plain file" in result["detail"]
    log.unlink()
    other = paths.job_dir(job) / "copy.txt"
    other.write_text("somebody else's file\n")
    os.link(other, log)
    assert "not a plain file" in alice_client.get(f"/jobs/{job.pk}/output/").json()["detail"]


def test_another_teams_job_output_is_a_404(bob_client: Any, job: Any) -> None:
    write_output(job, b"alice's output\n")
    assert bob_client.get(f"/jobs/{job.pk}/output/").status_code == 404
    assert bob_client.get(f"/jobs/{job.pk}/output.log").status_code == 404


def test_a_job_with_no_output_yet_says_so(alice_client: Any, job: Any) -> None:
    assert "has written no output yet" in alice_client.get(f"/jobs/{job.pk}/").content.decode()
