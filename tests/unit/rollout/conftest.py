"""Fixtures for the rollout-layer tests: the tiny model loaded once, and an engine that plays scripted turns."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from agentfly.engines import Generation, ReplayEngine, Sampling

MARKER = re.compile(r"#rollout=(\d+)#")


@pytest.fixture(scope="session")
def tiny_model(tiny_model_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()


class ScriptedEngine(ReplayEngine):
    """A ``ReplayEngine`` that plays a list of assistant turns per rollout and records what it returned.

    Each rollout's question carries ``#rollout=K#``; the K-th script gives that rollout's turns in order,
    then ``final`` once they run out. ``generations[K]`` keeps every ``Generation`` handed to the loop, so a
    test can check the trajectory holds exactly those tokens.
    """

    def __init__(self, tokenizer: Any, scripts: Sequence[Sequence[str]], *, model: Any = None,
                 final: str = "The answer is 42.", max_model_len: int | None = None) -> None:
        self.scripts = [list(s) for s in scripts]
        self.final = final
        self.texts: dict[int, list[str]] = defaultdict(list)
        self.generations: dict[int, list[Generation]] = defaultdict(list)
        super().__init__(tokenizer, self._next_text, model=model, max_model_len=max_model_len)

    @staticmethod
    def rollout_of(prompt_text: str) -> int:
        found = MARKER.search(prompt_text)
        assert found, "the prompt carries no #rollout=K# marker"
        return int(found.group(1))

    def _next_text(self, prompt_text: str) -> str:
        k = self.rollout_of(prompt_text)
        done = len(self.texts[k])
        text = self.scripts[k][done] if done < len(self.scripts[k]) else self.final
        self.texts[k].append(text)
        return text

    async def generate(self, prompt_ids: Sequence[int], sampling: Sampling) -> Generation:
        gen = await super().generate(prompt_ids, sampling)
        k = self.rollout_of(self.tokenizer.decode(list(prompt_ids), skip_special_tokens=False))
        self.generations[k].append(gen)
        return gen


@pytest.fixture(scope="session")
def scripted_engine(tiny_tokenizer: Any) -> Callable[..., ScriptedEngine]:
    def make(scripts: Sequence[Sequence[str]], **kwargs: Any) -> ScriptedEngine:
        return ScriptedEngine(tiny_tokenizer, scripts, **kwargs)

    return make
