"""A calculator that holds a pooled instance for its rollout, and a resource that counts how many of its
instances are alive at once, across every pool and thread of the process (tests of pool limits), and a
calculator whose sandbox is killed from outside in about one rollout of ten (infrastructure failures)."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import threading
import zlib
from typing import Any

from agentfly.resources import InfrastructureFailure, Pool, ResourceSpec
from agentfly.rewards import reward
from agentfly.tools.builtin.calculator import evaluate_arithmetic
from agentfly.tools.tool import tool


class Counted:
    """A resource instance that does nothing but count itself."""

    kind = "other"
    lock = threading.Lock()
    alive = 0
    peak = 0
    started = 0

    def __init__(self, spec: Any = None) -> None:
        self.open = False

    async def start(self) -> None:
        with Counted.lock:
            Counted.alive += 1
            Counted.started += 1
            Counted.peak = max(Counted.peak, Counted.alive)
        self.open = True

    async def reset(self) -> None:
        pass

    async def health(self) -> bool:
        return self.open

    async def close(self) -> None:
        self.kill()

    def kill(self) -> None:
        if self.open:
            self.open = False
            with Counted.lock:
                Counted.alive -= 1

    @classmethod
    def forget(cls) -> None:
        with cls.lock:
            cls.alive = cls.peak = cls.started = 0


COUNTED = ResourceSpec(name="counted", factory=Counted, pool=Pool(min=0, max=1), acquire_timeout=120)


@tool(resource="counted", timeout=5)
async def calculator(expression: str, context: Any) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: Arithmetic with + - * / ( ) and integers, e.g. "37*48".
    """
    await context.resource("counted")
    return evaluate_arithmetic(expression)


def chaos_target(rollout_id: str) -> bool:
    """About one rollout in ten, chosen by its id (the same in every run): the ones whose sandbox is killed."""
    return zlib.crc32(rollout_id.encode()) % 10 == 0


@tool(name="calculator", resource="python", timeout=30)
async def chaos_calculator(expression: str, context: Any) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: Arithmetic with + - * / ( ) and integers, e.g. "37*48".
    """
    sandbox = await context.resource("python")
    if chaos_target(context.rollout_id):
        # Killed from outside while it runs, as the host's OOM killer or a lost node would.
        asyncio.get_running_loop().call_later(0.2, os.kill, sandbox.pid, signal.SIGKILL)
        await sandbox.run("import time; time.sleep(10)")
    await sandbox.run("pass")
    return evaluate_arithmetic(expression)


@reward
def judge_down(final_answer: str | None) -> float:
    """A reward whose judging service stopped answering: every rollout it scores is an infrastructure failure."""
    raise InfrastructureFailure("the judge at 127.0.0.1:9 stopped answering", "server_down")


@reward
def lookup_reward(final_answer: str | None, answer: str) -> float:
    """A reward with a bug: it reads a field no sample has, so it raises KeyError on every call."""
    return float(final_answer == {"k1": answer}["start"])


_flaky_calls = itertools.count()


@reward
def flaky_reward(final_answer: str | None, answer: str) -> float:
    """A reward that raises on every other call (a parser that fails on half the answers)."""
    if next(_flaky_calls) % 2:
        raise ValueError(f"cannot parse {final_answer!r}")
    return float((final_answer or "").strip() == str(answer).strip())
