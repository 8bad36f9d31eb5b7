"""Fixtures for the gateway tests: the tiny model, an engine that plays given turns (with the model's real
logprobs) and records every generation, and a gateway served over real HTTP."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from agentfly.engines import Generation, ReplayEngine, Sampling


class TurnsEngine(ReplayEngine):
    """Plays ``turns`` in order (then ``final``), tokenised character by character: a valid tokenisation that
    is not the one the tokenizer would choose, as a sampling model may produce, so any re-encoding of sampled
    text by the gateway shows. ``calls`` keeps every (prompt ids, generation) the engine was asked for and gave:
    what a test re-derives a trajectory from."""

    def __init__(self, tokenizer: Any, turns: Sequence[str], *, model: Any = None, final: str = "Done.") -> None:
        self.turns, self.final = list(turns), final
        self.calls: list[tuple[list[int], Generation]] = []
        super().__init__(tokenizer, lambda _: "", model=model)

    async def generate(self, prompt_ids: Sequence[int], sampling: Sampling) -> Generation:
        text = self.turns.pop(0) if self.turns else self.final
        ids = [i for ch in text for i in self.tokenizer(ch, add_special_tokens=False)["input_ids"]]
        ids = [*ids[: sampling.max_new_tokens - 1], self.stop_token_ids[0]]
        generation = Generation(ids, self._logprobs(list(prompt_ids), ids, sampling), "stop")
        self._count(prompt_ids, ids)
        self.calls.append((list(prompt_ids), generation))
        return generation


@pytest.fixture(scope="session")
def tiny(tiny_model_dir: Any) -> tuple[Any, Any]:
    """The tiny model and its tokenizer, loaded once."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval(), AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture
def turns_engine(tiny: tuple[Any, Any]) -> Callable[..., TurnsEngine]:
    model, tokenizer = tiny
    return lambda turns, **kw: TurnsEngine(tokenizer, turns, model=model, **kw)


@pytest.fixture
def serve() -> Iterator[Callable[..., Any]]:
    """``serve(engine, **gateway_kwargs)``: a ``Gateway`` on ``engine`` served over HTTP on a free port;
    ``limits=GatewayLimits(...)`` among the kwargs. Closed after the test."""
    from agentfly.gateway import Gateway
    from agentfly.gateway.server import GatewayServer

    servers: list[GatewayServer] = []

    def make(engine: Any, **kwargs: Any) -> GatewayServer:
        server = GatewayServer(Gateway(engine, **kwargs)).start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.close()
