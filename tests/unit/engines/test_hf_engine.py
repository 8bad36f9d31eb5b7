"""``HFEngine`` on the tiny model: batching of concurrent requests, seeded and greedy sampling, stop conditions."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

import pytest
import torch

import agentfly as af
from agentfly.engines import Generation, HFEngine
from agentfly.engines.hf import filter_probs

QUESTIONS = ["What is 37*48?", "Compute 12+5.", "Hi", "Evaluate (120+5)*33 for me please, step by step."]


@pytest.fixture
def engine(tiny_model: Any, tiny_tokenizer: Any) -> HFEngine:
    return HFEngine(tiny_model, tiny_tokenizer)


@pytest.fixture(scope="module")
def prompts(tiny_tokenizer: Any) -> list[list[int]]:
    texts = [tiny_tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                                add_generation_prompt=True) for q in QUESTIONS]
    return [tiny_tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def direct_logprobs(model: Any, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """The model's log-probabilities of ``tokens`` after ``prompt``, from one plain forward pass."""
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1: -1].float()
        return torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)


async def test_it_batches_concurrent_requests(engine: HFEngine, prompts: list[list[int]]) -> None:
    sampling = af.Sampling(temperature=1.0, max_new_tokens=6)
    results = await asyncio.gather(*(engine.generate(p, sampling.replace(seed=i)) for i, p in enumerate(prompts)))
    assert all(isinstance(g, Generation) and len(g.token_ids) == len(g.logprobs) >= 1 for g in results)
    assert engine.stats()["max_batch"] == len(prompts)
    assert engine.stats()["batches"] == 1 and engine.stats()["sequences"] == len(prompts)
    assert engine.stats()["prompt_tokens"] == sum(map(len, prompts))
    assert engine.stats()["generated_tokens"] == sum(len(g.token_ids) for g in results)


async def test_it_batches_only_requests_with_the_same_sampling_settings(engine: HFEngine,
                                                                         prompts: list[list[int]]) -> None:
    cold, hot = af.Sampling(temperature=0.5, max_new_tokens=4), af.Sampling(temperature=1.0, max_new_tokens=4)
    await asyncio.gather(*(engine.generate(p, cold if i % 2 else hot) for i, p in enumerate(prompts)))
    assert engine.stats()["batches"] == 2 and engine.stats()["max_batch"] == 2


async def test_it_samples_the_same_tokens_for_a_seed_whatever_shares_the_batch(
    engine: HFEngine, prompts: list[list[int]]
) -> None:
    # Prompts of different lengths (left padding) and seeds whose rows stop at different steps (rows drop
    # out of the batch and the KV cache; seed 3 samples <|im_end|> first): none of it may change what a
    # seeded request samples.
    def sampling(seed: int) -> af.Sampling:
        return af.Sampling(temperature=1.0, max_new_tokens=12, seed=seed, stop=("\n",))

    requests = [(p, seed) for p in prompts for seed in (1, 2, 3)]
    alone = [await engine.generate(p, sampling(seed)) for p, seed in requests]
    assert engine.stats()["max_batch"] == 1
    together = await asyncio.gather(*(engine.generate(p, sampling(seed)) for p, seed in requests))
    assert engine.stats()["max_batch"] == len(requests)
    assert len({len(g.token_ids) for g in alone}) > 1, "the rows should finish at different steps"
    for a, b in zip(alone, together, strict=True):
        assert a.token_ids == b.token_ids
        assert a.finish_reason == b.finish_reason
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    again = await engine.generate(prompts[0], sampling(2))
    assert again.token_ids == alone[1].token_ids
    other_seed = [await engine.generate(prompts[0], sampling(s)) for s in (4, 5)]
    assert len({tuple(g.token_ids) for g in [alone[0], alone[1], *other_seed]}) > 1


async def test_its_greedy_logprobs_equal_a_direct_forward_pass(engine: HFEngine, tiny_model: Any,
                                                               prompts: list[list[int]]) -> None:
    greedy = af.Sampling(temperature=0, max_new_tokens=10)
    results = await asyncio.gather(*(engine.generate(p, greedy) for p in prompts))
    for prompt, gen in zip(prompts, results, strict=True):
        with torch.inference_mode():
            logits = tiny_model(input_ids=torch.tensor([prompt + gen.token_ids])).logits[0, len(prompt) - 1: -1]
        assert gen.token_ids == logits.argmax(-1).tolist()  # greedy really took the argmax each step
        expected = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(gen.token_ids)[:, None])
        assert gen.logprobs == pytest.approx(expected.squeeze(-1).tolist(), abs=1e-4)


async def test_its_sampled_logprobs_are_under_the_tempered_distribution_before_truncation(
    engine: HFEngine, tiny_model: Any, prompts: list[list[int]]
) -> None:
    # top_k=1 always samples the argmax, yet the logprob is that of log_softmax(logits / T) over the full
    # vocabulary: the distribution the trainer recomputes for the importance ratio.
    greedy = await engine.generate(prompts[0], af.Sampling(temperature=0, max_new_tokens=8))
    top1 = await engine.generate(prompts[0], af.Sampling(temperature=0.5, top_k=1, max_new_tokens=8, seed=0))
    assert top1.token_ids == greedy.token_ids
    with torch.inference_mode():
        logits = tiny_model(input_ids=torch.tensor([prompts[0] + top1.token_ids])).logits[0, len(prompts[0]) - 1: -1]
    expected = torch.log_softmax(logits.float() / 0.5, -1).gather(-1, torch.tensor(top1.token_ids)[:, None])
    assert top1.logprobs == pytest.approx(expected.squeeze(-1).tolist(), abs=1e-4)
    assert all(lp < 0 for lp in top1.logprobs)


async def test_it_stops_at_a_stop_string_and_keeps_the_sampled_tokens(engine: HFEngine, tiny_tokenizer: Any,
                                                                      prompts: list[list[int]]) -> None:
    free = await engine.generate(prompts[1], af.Sampling(temperature=0, max_new_tokens=24))
    assert free.finish_reason == "length" and len(free.token_ids) == 24
    stop = tiny_tokenizer.decode(free.token_ids[15:17])
    # The shortest prefix of the free run whose text contains the stop string is what must come back.
    cut = next(n for n in range(1, 25) if stop in tiny_tokenizer.decode(free.token_ids[:n]))
    stopped = await engine.generate(prompts[1], af.Sampling(temperature=0, max_new_tokens=24, stop=(stop,)))
    assert (stopped.finish_reason, stopped.stop_reason) == ("stop", stop)
    assert stopped.token_ids == free.token_ids[:cut]
    assert stopped.logprobs == pytest.approx(free.logprobs[:cut], abs=1e-5)


async def test_it_stops_at_a_stop_token_and_keeps_it(engine: HFEngine, prompts: list[list[int]]) -> None:
    assert engine.stop_token_ids == [engine.tokenizer.convert_tokens_to_ids("<|im_end|>"),
                                     engine.tokenizer.convert_tokens_to_ids("<|endoftext|>")]
    free = await engine.generate(prompts[0], af.Sampling(temperature=0, max_new_tokens=12))
    # Declare a token the greedy run produces a stop token: decoding must end right after its first use.
    engine.stop_token_ids = [free.token_ids[4]]
    cut = free.token_ids.index(free.token_ids[4]) + 1
    stopped = await engine.generate(prompts[0], af.Sampling(temperature=0, max_new_tokens=12))
    assert (stopped.finish_reason, stopped.stop_reason) == ("stop", free.token_ids[4])
    assert stopped.token_ids == free.token_ids[:cut]


async def test_it_ends_with_length_after_max_new_tokens(engine: HFEngine, prompts: list[list[int]]) -> None:
    gen = await engine.generate(prompts[2], af.Sampling(temperature=0, max_new_tokens=5))
    assert gen.finish_reason == "length" and gen.stop_reason is None
    assert len(gen.token_ids) == len(gen.logprobs) == 5


async def test_it_returns_length_for_prompts_at_or_past_the_context_length(tiny_model: Any, tiny_tokenizer: Any,
                                                                           prompts: list[list[int]]) -> None:
    short = HFEngine(tiny_model, tiny_tokenizer, max_model_len=len(prompts[0]) + 3)
    sampling = af.Sampling(temperature=0, max_new_tokens=50)
    over, full, near = await asyncio.gather(
        short.generate(prompts[3], sampling),  # longer than the context
        short.generate(prompts[0] + [5, 6, 7], sampling),  # exactly the context
        short.generate(prompts[0], sampling),  # three tokens of room
    )
    assert (over.token_ids, over.logprobs, over.finish_reason) == ([], [], "length")
    assert (full.token_ids, full.finish_reason) == ([], "length")
    assert near.finish_reason == "length" and len(near.token_ids) == 3
    assert (await short.generate([], sampling)).finish_reason == "length"


async def test_it_updates_weights_in_place(tiny_model_dir: Path, prompts: list[list[int]]) -> None:
    own = HFEngine(tiny_model_dir)
    greedy = af.Sampling(temperature=0, max_new_tokens=4)
    before = await own.generate(prompts[0], greedy)
    state = {k: v.clone() for k, v in own.model.state_dict().items()}
    state["model.norm.weight"] = -state["model.norm.weight"]  # flip every logit: argmax becomes argmin
    own.update_weights(state)
    after = await own.generate(prompts[0], greedy)
    assert after.token_ids[0] != before.token_ids[0]
    with pytest.raises(KeyError, match=r"no parameter 'nope\.weight'"):
        own.update_weights({"nope.weight": torch.zeros(1)})


def test_it_loads_only_existing_local_directories(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        HFEngine(tmp_path / "missing")


def test_it_filters_probabilities_by_top_k_and_top_p() -> None:
    probs = torch.tensor([[0.05, 0.5, 0.15, 0.3], [0.4, 0.3, 0.2, 0.1]])

    def kept(top_p: float, top_k: int) -> list[list[int]]:
        out = filter_probs(probs, top_p, top_k)
        assert torch.equal(out[out > 0], probs[out > 0])  # kept tokens keep their probability
        return (out > 0).int().tolist()

    assert kept(1.0, 0) == [[1, 1, 1, 1], [1, 1, 1, 1]]
    assert kept(1.0, 2) == [[0, 1, 0, 1], [1, 1, 0, 0]]
    assert kept(0.7, 0) == [[0, 1, 0, 1], [1, 1, 0, 0]]  # 0.5 + 0.3 and 0.4 + 0.3 reach 0.7
    assert kept(0.9, 0) == [[0, 1, 1, 1], [1, 1, 1, 0]]
    assert kept(0.1, 0) == [[0, 1, 0, 0], [1, 0, 0, 0]]  # the top token is always kept
    assert kept(0.9, 2) == [[0, 1, 0, 1], [1, 1, 0, 0]]  # both filters apply


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"temperature": -1}, "temperature"), ({"top_p": 0}, "top_p"), ({"top_k": -1}, "top_k"),
     ({"max_new_tokens": 0}, "max_new_tokens")],
)
def test_it_rejects_impossible_sampling_settings(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=f"Sampling.{message}"):
        af.Sampling(**kwargs)


def test_it_takes_one_stop_string_as_a_tuple() -> None:
    assert af.Sampling(stop="\n").stop == ("\n",)
    assert af.Sampling(stop=["a", "b"]).stop == ("a", "b")  # type: ignore[arg-type]


async def test_it_batches_requests_whose_only_difference_is_their_token_budget(engine: HFEngine,
                                                                               prompts: list[list[int]]) -> None:
    # The rollout loop caps max_new_tokens by each rollout's remaining context, so near the context limit
    # every rollout asks for a different budget; those requests must still share one batch.
    budgets = [3, 5, 8, 13]
    results = await asyncio.gather(*(
        engine.generate(p, af.Sampling(temperature=0, max_new_tokens=b)) for p, b in zip(prompts, budgets, strict=True)
    ))
    assert engine.stats()["batches"] == 1 and engine.stats()["max_batch"] == len(prompts)
    for p, b, gen in zip(prompts, budgets, results, strict=True):
        alone = await engine.generate(p, af.Sampling(temperature=0, max_new_tokens=b))
        assert gen.token_ids == alone.token_ids
        assert len(gen.token_ids) <= b
        assert gen.finish_reason == ("length" if len(gen.token_ids) == b and gen.stop_reason is None else "stop")


async def test_it_splits_the_queue_into_batches_of_at_most_max_batch_size(tiny_model: Any, tiny_tokenizer: Any,
                                                                          prompts: list[list[int]]) -> None:
    small = HFEngine(tiny_model, tiny_tokenizer, max_batch_size=3)
    greedy = af.Sampling(temperature=0, max_new_tokens=4)
    results = await asyncio.gather(*(small.generate(p, greedy) for p in prompts + prompts[:2]))
    stats = small.stats()
    assert (stats["batches"], stats["max_batch"], stats["sequences"]) == (2, 3, 6)
    assert [g.token_ids for g in results[4:]] == [g.token_ids for g in results[:2]]


async def test_it_raises_a_failed_decode_to_its_callers_instead_of_hanging(engine: HFEngine,
                                                                          prompts: list[list[int]]) -> None:
    greedy = af.Sampling(temperature=0, max_new_tokens=4)
    with pytest.raises(IndexError):
        await asyncio.wait_for(engine.generate([10**6], greedy), timeout=30)
    assert (await engine.generate(prompts[0], greedy)).token_ids  # the engine keeps serving


async def test_it_computes_a_shared_system_prompt_and_repeated_prompts_once(engine: HFEngine, tiny_model: Any,
                                                                            tiny_tokenizer: Any) -> None:
    # A training batch: every prompt starts with the same system prompt and tool schemas, and each task is
    # sampled several times. The shared work is done once, and every row still gets exactly its own
    # prompt's distribution (greedy tokens and logprobs equal a plain forward pass over that row alone).
    from agentfly.tools.builtin.calculator import calculator

    def prompt(question: str) -> list[int]:
        text = tiny_tokenizer.apply_chat_template([{"role": "user", "content": question}], tools=[calculator.schema],
                                                  tokenize=False, add_generation_prompt=True)
        return tiny_tokenizer(text, add_special_tokens=False)["input_ids"]

    distinct = [prompt(q) for q in QUESTIONS]
    batch = [p for p in distinct for _ in range(3)]
    greedy = af.Sampling(temperature=0, max_new_tokens=8)
    results = await asyncio.gather(*(engine.generate(p, greedy) for p in batch))
    assert engine.stats()["batches"] == 1
    shared = next(k for k in range(min(map(len, distinct))) if len({p[k] for p in distinct}) > 1)
    assert shared > 50  # the system prompt
    assert engine.stats()["prefill_tokens"] == shared + sum(len(p) - shared for p in distinct)
    assert engine.stats()["prompt_tokens"] == sum(map(len, batch))
    for p, gen in zip(batch, results, strict=True):
        expected = direct_logprobs(tiny_model, p, gen.token_ids)
        assert gen.logprobs == pytest.approx(expected.tolist(), abs=1e-4)
        with torch.inference_mode():
            logits = tiny_model(input_ids=torch.tensor([p + gen.token_ids])).logits[0, len(p) - 1: -1]
        assert gen.token_ids == logits.argmax(-1).tolist()


def greedy_tokens(model: Any, prompt: list[int], tokens: list[int]) -> list[int]:
    """The argmax at each position of ``tokens`` after ``prompt``: what greedy decoding must have produced."""
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1: -1]
    return logits.argmax(-1).tolist()


async def test_a_request_that_arrives_while_a_batch_decodes_joins_it_and_keeps_its_tokens_and_logprobs(
    engine: HFEngine, tiny_model: Any, prompts: list[list[int]]
) -> None:
    # The first row (seed 11) samples 40 tokens without a stop, so it is still decoding when the two other
    # requests arrive: they must join its batch at the next step, not wait for it to drain, and each must
    # sample what it samples alone, with logprobs equal to a plain forward pass over its own tokens.
    def sampling(seed: int, budget: int = 10) -> af.Sampling:
        return af.Sampling(temperature=1.0, max_new_tokens=budget, seed=seed)

    first = asyncio.ensure_future(engine.generate(prompts[1], sampling(11, 40)))

    async def decoding() -> None:
        while engine.stats()["decode_steps"] < 3:
            await asyncio.sleep(0.001)

    await asyncio.wait_for(decoding(), timeout=30)
    joined = await asyncio.gather(engine.generate(prompts[3], sampling(7)), engine.generate(prompts[0], sampling(8)))
    head = await first
    stats = engine.stats()
    assert stats["joined_mid_batch"] == 2 and stats["max_batch"] == 3 and stats["batches"] == 2
    assert len(head.token_ids) == 40
    alone = HFEngine(engine.model, engine.tokenizer)
    for prompt, gen, s in [(prompts[1], head, sampling(11, 40)), (prompts[3], joined[0], sampling(7)),
                           (prompts[0], joined[1], sampling(8))]:
        assert gen.logprobs == pytest.approx(direct_logprobs(tiny_model, prompt, gen.token_ids).tolist(), abs=1e-4)
        assert (await alone.generate(prompt, s)).token_ids == gen.token_ids


def next_turn(tokenizer: Any, prompt: list[int], gen: Generation, observation: str) -> list[int]:
    """The conversation's next prompt as the rollout layer builds it: the earlier tokens as they are, then the
    observation and the template glue (``tokenizer`` renders them)."""
    glue = f"\n<|im_start|>user\n{observation}<|im_end|>\n<|im_start|>assistant\n"
    return prompt + gen.token_ids + tokenizer(glue, add_special_tokens=False)["input_ids"]


async def test_a_new_turn_prefills_only_its_new_tokens_and_keeps_exact_logprobs(
    engine: HFEngine, tiny_model: Any, tiny_tokenizer: Any, prompts: list[list[int]]
) -> None:
    sampling = af.Sampling(temperature=1.0, max_new_tokens=6, seed=3)
    firsts = await asyncio.gather(*(engine.generate(p, sampling) for p in prompts[:3]))
    seconds = [next_turn(tiny_tokenizer, p, g, f"result {i}") for i, (p, g) in enumerate(zip(prompts[:3], firsts, strict=True))]
    before = engine.stats()
    # Three second turns (cached histories of different lengths) and one fresh prompt share one admission.
    turns = await asyncio.gather(*(engine.generate(p, sampling) for p in [*seconds, prompts[3]]))
    after = engine.stats()
    reused = [len(p) + len(g.token_ids) - 1 for p, g in zip(prompts[:3], firsts, strict=True)]  # the last sampled token was never fed
    assert after["prefix_cache_hits"] - before["prefix_cache_hits"] == 3
    assert after["prefill_tokens_saved"] - before["prefill_tokens_saved"] == sum(reused)
    assert after["prefill_tokens"] - before["prefill_tokens"] == (
        sum(len(p) - n for p, n in zip(seconds, reused, strict=True)) + len(prompts[3]))
    assert after["batches"] - before["batches"] == 1
    for prompt, gen in zip([*seconds, prompts[3]], turns, strict=True):
        assert gen.logprobs == pytest.approx(direct_logprobs(tiny_model, prompt, gen.token_ids).tolist(), abs=1e-4)
    cold = HFEngine(tiny_model, tiny_tokenizer, prefix_cache_tokens=0)
    for prompt, gen in zip(seconds, turns[:3], strict=True):
        assert (await cold.generate(prompt, sampling)).token_ids == gen.token_ids
    assert cold.stats()["prefill_tokens_saved"] == 0  # 0 turns reuse off


async def test_kept_turns_are_dropped_when_the_weights_change(tiny_model_dir: Path, prompts: list[list[int]]) -> None:
    own = HFEngine(tiny_model_dir)
    greedy = af.Sampling(temperature=0, max_new_tokens=5)
    first = await own.generate(prompts[0], greedy)
    second = next_turn(own.tokenizer, prompts[0], first, "42")
    # The trainer steps the module the engine shares without calling update_weights: in-place writes.
    with torch.no_grad():
        own.model.model.norm.weight.mul_(-1.0)
    gen = await own.generate(second, greedy)
    assert own.stats()["prefix_cache_hits"] == 0
    assert gen.token_ids == greedy_tokens(own.model, second, gen.token_ids)
    third = next_turn(own.tokenizer, second, gen, "43")
    again = await own.generate(third, greedy)
    assert own.stats()["prefix_cache_hits"] == 1
    assert again.logprobs == pytest.approx(direct_logprobs(own.model, third, again.token_ids).tolist(), abs=1e-4)


async def test_a_synchronous_batch_is_refused_while_awaited_calls_decode_and_they_still_finish(
    engine: HFEngine, prompts: list[list[int]]
) -> None:
    long = af.Sampling(temperature=1.0, max_new_tokens=40, seed=11)  # samples all 40 tokens (see above)
    pending = asyncio.ensure_future(engine.generate(prompts[1], long))

    async def decoding() -> None:
        while engine.stats()["decode_steps"] < 2:
            await asyncio.sleep(0.001)

    await asyncio.wait_for(decoding(), timeout=30)
    with pytest.raises(RuntimeError, match="await them first"):
        engine.generate_batch([prompts[0]], [long])
    assert len((await asyncio.wait_for(pending, timeout=30)).token_ids) == 40
    assert [len(g.token_ids) for g in engine.generate_batch([prompts[1]], [long])] == [40]


def test_a_decode_step_appends_to_the_kv_cache_in_place_instead_of_copying_it(
    tiny_model: Any, tiny_tokenizer: Any, prompts: list[list[int]]
) -> None:
    # transformers' DynamicCache concatenates at every step, copying every row's whole cache: the engine's
    # layers write the new column into a buffer with room to grow, so the buffer moves only when it grows.
    seen: list[tuple[int, int]] = []

    class Watched(HFEngine):
        def _decode_step(self) -> list[Any]:
            assert self._running is not None
            layer = self._running.cache.layers[0]
            seen.append((layer.keys.data_ptr(), layer.keys.shape[-2]))
            return super()._decode_step()

    engine = Watched(tiny_model, tiny_tokenizer)
    sampling = af.Sampling(temperature=1.0, max_new_tokens=60)
    gens = engine.generate_batch([prompts[3]] * 2, [sampling.replace(seed=1), sampling.replace(seed=2)])
    steps = min(len(g.token_ids) for g in gens)
    assert steps > 20
    moves = sum(a[0] != b[0] for a, b in itertools.pairwise(seen[:steps]))  # both rows still decoding
    assert moves <= 3, f"the cache moved {moves} times in {steps} steps"
    for gen in gens:
        assert gen.logprobs == pytest.approx(direct_logprobs(tiny_model, prompts[3], gen.token_ids).tolist(), abs=1e-4)


def test_rows_leaving_the_batch_copy_only_the_rows_that_move_into_their_slots(
    tiny_model: Any, tiny_tokenizer: Any, prompts: list[list[int]]
) -> None:
    from agentfly.engines.hf import _compaction

    # Kept rows 0, 2, 5, 6 of 7: rows 5 and 6 move into the slots of rows 1 and 3; rows 0 and 2 stay.
    assert _compaction([0, 2, 5, 6]) == ([0, 5, 2, 6], [1, 3], [5, 6])
    assert _compaction([0, 1, 2]) == ([0, 1, 2], [], [])
    assert _compaction([4]) == ([4], [0], [4])
    seen: list[tuple[int, int]] = []

    class Watched(HFEngine):
        def _decode_step(self) -> list[Any]:
            assert self._running is not None
            layer = self._running.cache.layers[0]
            seen.append((layer._kbuf.data_ptr(), len(self._running.rows)))
            return super()._decode_step()

    engine = Watched(tiny_model, tiny_tokenizer)
    budgets = [4, 9, 14, 19, 24, 29, 34, 39]  # rows leave one by one, from the front of the batch
    samplings = [af.Sampling(temperature=1.0, max_new_tokens=n, seed=i) for i, n in enumerate(budgets)]
    gens = engine.generate_batch([prompts[i % 4] for i in range(len(budgets))], samplings)
    leaves = [(a, b) for a, b in itertools.pairwise(seen) if b[1] < a[1]]
    assert len(leaves) >= 4
    # The buffer stays where it is when rows leave (it moves only to grow, at most twice here).
    assert sum(a[0] != b[0] for a, b in leaves) <= 2
    for i, gen in enumerate(gens):  # and every row still samples exactly its own continuation
        assert gen.logprobs == pytest.approx(direct_logprobs(tiny_model, prompts[i % 4], gen.token_ids).tolist(),
                                             abs=1e-4)


def test_a_grouped_query_model_attends_with_its_kv_heads_as_they_are_and_computes_the_same_numbers(
    tiny_model_dir: Path, tiny_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import AutoModelForCausalLM
    from transformers.integrations import sdpa_attention

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert model.config.num_key_value_heads < model.config.num_attention_heads  # the tiny model is GQA
    ids = torch.randint(3, 400, (3, 24))
    mask = torch.ones(3, 24, dtype=torch.long)
    mask[1, :9] = 0  # padding: the case where transformers copies the KV heads on the CPU
    plain = model(input_ids=ids, attention_mask=mask).logits
    plain.square().sum().backward()
    plain_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()

    HFEngine(model, tiny_tokenizer)
    assert model.config._attn_implementation == "agentfly_sdpa"
    monkeypatch.setattr(sdpa_attention, "repeat_kv", lambda *a: pytest.fail("KV heads were copied"))
    native = model(input_ids=ids, attention_mask=mask).logits
    native.square().sum().backward()
    assert torch.allclose(native, plain, atol=1e-6)
    for a, b in zip(plain_grads, (p.grad for p in model.parameters()), strict=True):
        assert torch.allclose(a, b, atol=1e-6)


@pytest.mark.parametrize("heads,kv_heads,q", [(4, 4, 1), (4, 2, 1), (4, 2, 5), (6, 2, 3)])
@pytest.mark.parametrize("padded", [True, False])
@pytest.mark.parametrize("long_prompt", [False, True])
@pytest.mark.parametrize("few_rows", [False, True])
def test_a_prefix_held_once_is_attended_like_the_same_keys_in_every_row(
    heads: int, kv_heads: int, q: int, padded: bool, long_prompt: bool, few_rows: bool,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentfly.engines import hf
    from agentfly.engines.hf import _prefix_attention

    if long_prompt:  # scores past the limit: the SDPA path with the prefix broadcast
        monkeypatch.setattr(hf, "_PREFIX_SCORES_MAX", 0)
    torch.manual_seed(0)
    B, P, S, D = (2 if few_rows else 6), 7, 9, 8
    query = torch.randn(B, heads, q, D)
    pk, pv = torch.randn(1, kv_heads, P, D), torch.randn(1, kv_heads, P, D)
    key, value = torch.randn(B, kv_heads, S, D), torch.randn(B, kv_heads, S, D)
    # The rows' own part: left padding (row 1 has 3 columns of it), then causal over the q new tokens.
    # Two rows go the path of a few rows (the prefix copied in front of each row's keys), six the other.
    own = torch.ones(B, S, dtype=torch.bool)
    if padded:
        own[1, :3] = False
    causal = torch.ones(q, S, dtype=torch.bool).tril(S - q)
    mask = (own[:, None, None, :] & causal[None, None]) if padded or q == 1 else None
    got = _prefix_attention(query, key, value, pk, pv, mask, scaling=None)
    full_mask = torch.cat([torch.ones(B, 1, q, P, dtype=torch.bool), own[:, None, None, :] & causal[None, None]], -1)
    expected = torch.nn.functional.scaled_dot_product_attention(
        query, torch.cat([pk.expand(B, -1, -1, -1), key], 2), torch.cat([pv.expand(B, -1, -1, -1), value], 2),
        attn_mask=full_mask, enable_gqa=True).transpose(1, 2)
    assert got.shape == (B, q, heads, D)
    assert torch.allclose(got, expected, atol=1e-5)


async def test_a_system_prompt_is_held_once_for_the_batch_across_turns_joins_and_other_prefixes(
    tiny_model: Any, tiny_tokenizer: Any
) -> None:
    # Rollouts with a long system prompt (the tool schemas): the batch holds its KV once, not in every row.
    # Their second turns reuse their KV after it; a request on another system prompt joining mid-batch takes
    # its prefix into the rows. Every row's logprobs still equal a plain forward pass over it alone.
    from agentfly.tools.builtin.calculator import calculator

    def prompt(question: str, tools: bool = True) -> list[int]:
        text = tiny_tokenizer.apply_chat_template(
            [{"role": "system", "content": "You add numbers."}] * (not tools) + [{"role": "user", "content": question}],
            tools=[calculator.schema] if tools else None, tokenize=False, add_generation_prompt=True)
        return tiny_tokenizer(text, add_special_tokens=False)["input_ids"]

    held: list[tuple[int, int]] = []  # (prefix length, row cache width) at each decode step

    class Watched(HFEngine):
        def _decode_step(self) -> list[Any]:
            assert self._running is not None
            run = self._running
            held.append((len(run.prefix.ids) if run.prefix else 0, run.cache.layers[0].keys.shape[2]))
            return super()._decode_step()

    engine = Watched(tiny_model, tiny_tokenizer)
    sampling = af.Sampling(temperature=1.0, max_new_tokens=12, seed=5)
    firsts_p = [prompt(q) for q in QUESTIONS[:3]]
    firsts = await asyncio.gather(*(engine.generate(p, sampling) for p in firsts_p))
    assert held and all(n > 50 for n, _ in held)  # the system prompt and tool schemas, held apart
    assert max(width for _, width in held) < min(map(len, firsts_p))  # no row's cache holds them
    seconds = [next_turn(tiny_tokenizer, p, g, "42") for p, g in zip(firsts_p, firsts, strict=True)]
    other = prompt("What is 2+2?", tools=False)
    long = af.Sampling(temperature=1.0, max_new_tokens=30, seed=6)
    held.clear()
    head = asyncio.ensure_future(engine.generate(seconds[0], long))

    async def decoding() -> None:
        while len(held) < 3:
            await asyncio.sleep(0.001)

    await asyncio.wait_for(decoding(), timeout=30)
    assert held[-1][0] > 50  # a reused turn continues on the held prefix
    joined = await asyncio.gather(engine.generate(seconds[1], sampling), engine.generate(other, sampling))
    turns = [await head, *joined]
    assert any(n == 0 for n, _ in held)  # the other system prompt joined: every row holds its prefix
    assert engine.stats()["prefix_cache_hits"] >= 2
    for p, gen in zip([*firsts_p, seconds[0], seconds[1], other], [*firsts, *turns], strict=True):
        assert gen.logprobs == pytest.approx(direct_logprobs(tiny_model, p, gen.token_ids).tolist(), abs=1e-4)
