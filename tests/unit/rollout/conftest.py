"""Fixtures for the rollout-layer tests: the tiny model loaded once, and an engine that plays scripted turns."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from agentfly.engines import Generation, ReplayEngine, Sampling

MARKER = re.compile(r"#rollout=(\d+)#")


class ScriptedEngine(ReplayEngine):
    """A ``ReplayEngine`` that plays a list of assistant turns per rollout and records what it returned.

    Each rollout's question carries ``#rollout=K#``; the K-th script gives that rollout's turns in order,
    then ``final`` once they run out. ``generations[K]`` keeps every ``Generation`` handed to the loop, so a
    test can check the trajectory holds exactly those tokens. With ``char_level=True`` each character is
    tokenised on its own: a valid tokenisation of the text that is *not* the one the tokenizer would choose,
    as a sampling model may produce, so any re-encoding of sampled text by the rollout loop shows.
    """

    def __init__(self, tokenizer: Any, scripts: Sequence[Sequence[str]], *, model: Any = None,
                 final: str = "The answer is 42.", max_model_len: int | None = None,
                 char_level: bool = False) -> None:
        self.scripts = [list(s) for s in scripts]
        self.final = final
        self.char_level = char_level
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

    def _char_level(self, prompt_ids: list[int], sampling: Sampling) -> Generation:
        text = self._next_text(self.tokenizer.decode(prompt_ids, skip_special_tokens=False))
        ids = [i for ch in text for i in self.tokenizer(ch, add_special_tokens=False)["input_ids"]]
        budget = min(sampling.max_new_tokens, self.max_model_len - len(prompt_ids))
        if len(ids) + 1 > budget:
            ids, finish = ids[:budget], "length"
        else:
            ids, finish = [*ids, self.stop_token_ids[0]], "stop"
        return Generation(ids, self._logprobs(prompt_ids, ids, sampling), finish)  # type: ignore[arg-type]

    async def generate(self, prompt_ids: Sequence[int], sampling: Sampling) -> Generation:
        if self.char_level:
            gen = self._char_level(list(prompt_ids), sampling)
        else:
            gen = await super().generate(prompt_ids, sampling)
        k = self.rollout_of(self.tokenizer.decode(list(prompt_ids), skip_special_tokens=False))
        self.generations[k].append(gen)
        return gen


@pytest.fixture(scope="session")
def scripted_engine(tiny_tokenizer: Any) -> Callable[..., ScriptedEngine]:
    def make(scripts: Sequence[Sequence[str]], **kwargs: Any) -> ScriptedEngine:
        return ScriptedEngine(tiny_tokenizer, scripts, **kwargs)

    return make
