"""Every engine honours the ``Engine`` contract the rollout layer and the trainer rely on.

One test body runs against each engine on the tiny model: it is an ``Engine``, names its tokenizer, context
length and end-of-turn tokens, samples a turn whose logprobs match its tokens, counts that turn in
``stats()`` (what the trainer puts in every ``resources`` event), takes new weights, and closes. The vLLM case
needs the ``vllm`` extra and runs in the suite's vLLM process (``scripts/test.sh``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentfly.engines import Engine, Sampling

ENGINES = ["hf", "replay", pytest.param("vllm", marks=[pytest.mark.vllm, pytest.mark.integration])]


def build(name: str, model_dir: Path) -> Engine:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if name == "vllm":
        pytest.importorskip("vllm")
        from agentfly.engines.vllm import VLLMEngine

        return VLLMEngine(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    if name == "hf":
        from agentfly.engines.hf import HFEngine

        return HFEngine(model=model, tokenizer=tokenizer)
    from agentfly.engines import ReplayEngine

    return ReplayEngine(tokenizer, lambda prompt: "The answer is 4.", model=model)


@pytest.fixture(scope="module", params=ENGINES)
def engine(request: pytest.FixtureRequest, tiny_model_dir: Path) -> Iterator[Engine]:
    built = build(request.param, tiny_model_dir)
    yield built
    built.close()


def prompt_ids(engine: Engine) -> list[int]:
    tok = engine.tokenizer
    text = tok.apply_chat_template([{"role": "user", "content": "What is 2+2?"}], tokenize=False,
                                   add_generation_prompt=True)
    return list(tok(text, add_special_tokens=False)["input_ids"])


def state_dict_of(model_dir: Path) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir).state_dict()


def test_each_engine_names_its_tokenizer_context_length_and_end_of_turn_tokens(engine: Engine) -> None:
    assert isinstance(engine, Engine)
    assert engine.tokenizer.eos_token_id in engine.stop_token_ids
    assert all(isinstance(t, int) for t in engine.stop_token_ids)
    assert isinstance(engine.max_model_len, int) and engine.max_model_len >= 64


def test_each_engine_counts_the_turns_it_generates_in_its_stats(engine: Engine) -> None:
    before = engine.stats()
    gen = asyncio.run(engine.generate(prompt_ids(engine), Sampling(temperature=0.0, max_new_tokens=12, seed=0)))
    after = engine.stats()
    assert 1 <= len(gen.token_ids) == len(gen.logprobs) <= 12
    assert gen.finish_reason in ("stop", "length")
    assert all(isinstance(k, str) and isinstance(v, float) for k, v in after.items()), after
    assert after["sequences"] - before.get("sequences", 0.0) == 1.0
    assert after["generated_tokens"] - before.get("generated_tokens", 0.0) == float(len(gen.token_ids))


def test_each_engine_takes_its_own_weights_back_and_samples_the_same_greedy_turn(engine: Engine,
                                                                                 tiny_model_dir: Path) -> None:
    sampling = Sampling(temperature=0.0, max_new_tokens=8)
    first = asyncio.run(engine.generate(prompt_ids(engine), sampling))
    engine.update_weights(state_dict_of(tiny_model_dir))
    again = asyncio.run(engine.generate(prompt_ids(engine), sampling))
    assert again.token_ids == first.token_ids
