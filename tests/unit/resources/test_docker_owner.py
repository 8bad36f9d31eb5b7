"""The owner label of what the docker backend makes: a sweep removes only what a process of this host left
when it is known to be gone. No engine is needed to judge a label."""

from __future__ import annotations

import os
import subprocess
import sys

from agentfly.resources.backends.docker import owner, owner_gone
from agentfly.resources.backends.local import start_time


def test_a_running_owner_is_never_taken_for_gone() -> None:
    assert not owner_gone(owner())


def test_a_process_that_ended_or_whose_pid_was_reused_is_gone() -> None:
    host, boot, _, _ = owner().split(":")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    started = start_time(child.pid)
    assert started and not owner_gone(f"{host}:{boot}:{child.pid}:{started}")
    child.kill()
    child.wait()
    assert owner_gone(f"{host}:{boot}:{child.pid}:{started}")
    assert owner_gone(f"{host}:{boot}:{os.getpid()}:{(start_time(os.getpid()) or 0) + 1}")  # the pid, reused


def test_an_owner_from_before_the_last_boot_is_gone_and_another_hosts_is_never_judged() -> None:
    host, boot, pid, started = owner().split(":")
    assert owner_gone(f"{host}:an-earlier-boot:{pid}:{started}")
    assert not owner_gone(f"another-host:{boot}:{pid}:{started}")
    assert not owner_gone("another-host:an-earlier-boot:999999:1")
    assert not owner_gone("") and not owner_gone("not a label")  # containers made before labels: left alone
