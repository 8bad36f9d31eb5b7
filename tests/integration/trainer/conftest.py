"""Fixtures of the trainer's integration tests: the real ``agentfly`` entry point and a CI-sized run.

Torch runs on one thread (several test processes share the cores). This folder holds ``rewards_for_tests``,
which runs name as ``rollout.reward=rewards_for_tests:answer_length``: it is importable in this process
(for ``Trainer`` built in the test) and in every ``agentfly`` subprocess (on its ``PYTHONPATH``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)

HERE = Path(__file__).parent

Agentfly = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture(scope="session", autouse=True)
def rewards_for_tests_importable() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(HERE))
        yield


@pytest.fixture(scope="session")
def agentfly() -> Agentfly:
    """``agentfly(*args, timeout=300)``: run the installed ``agentfly`` command, output captured as text."""

    def run(*args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
        exe = Path(sys.executable).parent / "agentfly"
        cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "trainer.cli"]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
        return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=timeout, env=env)

    return run


@pytest.fixture(scope="session")
def tiny_overrides() -> Callable[..., list[str]]:
    """``tiny_overrides(model_dir, out, *extra)``: ``--set`` values of a run small enough for CI (2 prompts x
    2 samples, short turns, 4 eval problems), then ``extra``."""

    def overrides(model_dir: Path, out: Path, *extra: str) -> list[str]:
        return [
            f"model.path={model_dir}", f"output_dir={out}", "steps=2", "threads=1", "progress=false",
            "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=8", "rollout.max_turns=2",
            "data.train_size=64", "data.eval_size=4", "eval.max_new_tokens=8", "log_samples=1", *extra,
        ]

    return overrides
