"""Rollouts overlap: while one waits on a slow tool, the others generate and call theirs."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import agentfly as af

SLEEP = 0.3


@af.tool
async def slow_lookup(key: str) -> str:
    """A tool that waits on the network."""
    await asyncio.sleep(SLEEP)
    return f"value of {key}"


def call(key: str) -> str:
    return "<tool_call>\n" + json.dumps({"name": "slow_lookup", "arguments": {"key": key}}) + "\n</tool_call>"


def samples(n: int) -> list[dict[str, Any]]:
    return [{"id": f"s{k}", "question": f"Look up #rollout={k}#."} for k in range(n)]


async def test_concurrent_rollouts_with_a_slow_tool_take_a_fraction_of_the_sequential_time(
    scripted_engine: Callable[..., Any],
) -> None:
    n = 8
    scripts = [[call(f"k{k}"), "Done."] for k in range(n)]

    sequential_engine = scripted_engine(scripts)
    sequential_agent = af.Agent(model=sequential_engine, tools=[slow_lookup], max_turns=3)
    start = time.perf_counter()
    sequential = [(await sequential_agent.run([s]))[0] for s in samples(n)]
    sequential_time = time.perf_counter() - start

    concurrent_engine = scripted_engine(scripts)
    concurrent_agent = af.Agent(model=concurrent_engine, tools=[slow_lookup], max_turns=3)
    start = time.perf_counter()
    concurrent = await concurrent_agent.run(samples(n))
    concurrent_time = time.perf_counter() - start

    assert sequential_time >= n * SLEEP  # the sleeps alone bound it from below
    assert concurrent_time < 0.5 * sequential_time, (concurrent_time, sequential_time)
    for a, b in zip(sequential, concurrent, strict=True):
        assert a.token_ids == b.token_ids and a.loss_mask == b.loss_mask  # overlap changes timing, not tokens
        assert b.finish_reason == "answer" and b.final_answer == "Done."
        assert [c.observation for c in b.tool_calls] == [f"value of k{b.sample['id'][1:]}"]


class Inside:
    """How many calls are inside a tool at once (``running``) and the most there ever were (``peak``)."""

    def __init__(self) -> None:
        self.running = self.peak = 0


def counting_lookup(full_at: int, bound: float) -> tuple[af.Tool, Inside]:
    """A tool that waits on the network, counting the calls inside it at once. A call waits until ``full_at``
    calls are inside together, or ``bound`` seconds at most: calls run together wait for each other, calls
    admitted one at a time (or fewer than ``full_at``) wait out the bound and still finish."""
    inside, full = Inside(), asyncio.Event()

    @af.tool(name="slow_lookup")
    async def counted_lookup(key: str) -> str:
        """Look a key up."""
        inside.running += 1
        inside.peak = max(inside.peak, inside.running)
        if inside.running >= full_at:
            full.set()
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(full.wait(), bound)
            return f"value of {key}"
        finally:
            inside.running -= 1
            if inside.running < full_at:
                full.clear()

    return counted_lookup, inside


async def test_the_tool_calls_of_one_turn_run_concurrently(scripted_engine: Callable[..., Any]) -> None:
    keys = ["a", "b", "c", "d"]
    one_turn = scripted_engine([["".join(call(k) for k in keys), "Done."]])
    many_turns = scripted_engine([[*(call(k) for k in keys), "Done."]])
    tool, together_inside = counting_lookup(len(keys), 0.2)
    together = (await af.Agent(model=one_turn, tools=[tool], max_turns=6).run(samples(1)))[0]
    tool, apart_inside = counting_lookup(len(keys), 0.2)
    apart = (await af.Agent(model=many_turns, tools=[tool], max_turns=6).run(samples(1)))[0]
    assert [c.name for c in together.tool_calls] == [c.name for c in apart.tool_calls] == ["slow_lookup"] * 4
    assert [c.turn for c in together.tool_calls] == [0, 0, 0, 0]
    assert [c.observation for c in together.tool_calls] == [f"value of {k}" for k in keys]  # in call order
    # One turn's calls all in flight at once; turns one by one.
    assert (together_inside.peak, apart_inside.peak) == (len(keys), 1)


async def test_max_concurrency_bounds_the_rollouts_in_flight(scripted_engine: Callable[..., Any]) -> None:
    n, limit = 6, 2
    tool, inside = counting_lookup(limit, 2.0)  # each wave of rollouts fills, then leaves
    agent = af.Agent(model=scripted_engine([[call("x"), "Done."]] * n), tools=[tool], max_concurrency=limit)
    trajectories = await agent.run(samples(n))
    assert inside.peak == limit  # never more than the limit in flight, and the limit is used
    assert all(t.finish_reason == "answer" for t in trajectories)


@af.tool(resource="notes")
async def slow_note(context: Any) -> str:
    """Write a note, taking longer than a queued rollout may wait for the pool."""
    pad = await context.resource("notes")
    pad.write("k", "v")
    await asyncio.sleep(0.6)
    return "noted"


NOTE = "<tool_call>\n" + json.dumps({"name": "slow_note", "arguments": {}}) + "\n</tool_call>"


def notes_pool() -> af.ResourceSpec:
    """A pool of 2 scratchpads whose queue gives up after 0.3 s, less than one ``slow_note`` holds one."""
    return af.ResourceSpec(name="notes", factory=af.resources.Scratchpad, kind="other", backend="inprocess",
                           pool=af.Pool(min=0, max=2), acquire_timeout=0.3)


async def test_a_training_batch_larger_than_its_pool_runs_every_rollout_instead_of_timing_the_rest_out(
        tiny_tokenizer: Any) -> None:
    # 4 prompts x 3 rollouts against a pool of 2 whose queue gives up after 0.3 s: the rollout layer admits no
    # more rollouts than the pool holds, so none waits in its queue behind a whole episode.
    async with af.ResourceEngine([notes_pool()]) as engine:
        agent = af.Agent(model=af.ReplayEngine(tiny_tokenizer, lambda p: NOTE if "<tool_response>" not in p else "done"),
                         tools=[slow_note], resources=engine, max_turns=3)
        trajectories = await agent.run(samples(4), group_size=3)
        assert [t.failure for t in trajectories] == [None] * 12, {t.failure_reason for t in trajectories}
        assert all(t.tool_calls[0].observation == "noted" for t in trajectories)
        assert engine.stats()["notes"]["created"] <= 2


async def test_rollouts_on_the_hf_engine_share_batches_and_reproduce_with_a_seed(tiny_model_dir: Path) -> None:
    agent = af.Agent(model=tiny_model_dir, tools=[slow_lookup], max_turns=2, engine="hf")
    qs = [{"id": f"q{i}", "question": f"What is {i}*{i + 7}?", "answer": str(i * (i + 7))} for i in range(3)]
    sampling = af.Sampling(temperature=1.0, max_new_tokens=12, seed=7)
    first = await agent.run(qs, group_size=4, sampling=sampling)
    assert len(first) == 12
    tokenizer = agent.tokenizer
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert agent.engine.stats()["max_batch"] > 1
    for t in first:
        assert len(t.token_ids) == len(t.loss_mask) == len(t.logprobs)
        assert t.error is None and t.num_turns >= 1
        sampled = [lp for lp, m in zip(t.logprobs, t.loss_mask, strict=True) if m == 1]
        assert len(sampled) == sum(turn.end - turn.start for turn in t.turns) and all(lp < 0 for lp in sampled)
        assert all(lp == 0.0 for lp, m in zip(t.logprobs, t.loss_mask, strict=True) if m == 0)
        # Sampled text re-renders to the same tokens when each turn ended with <|im_end|> (not <|endoftext|>).
        if all(t.token_ids[turn.end - 1] == im_end for turn in t.turns if turn.finish_reason == "stop"):
            decoded = tokenizer.decode(t.token_ids, skip_special_tokens=False)
            rendering = tokenizer.apply_chat_template(t.messages, tools=[slow_lookup.schema], tokenize=False,
                                                      add_generation_prompt=t.messages[-1]["role"] != "assistant")
            assert rendering.startswith(decoded)
    again = await agent.run(qs, group_size=4, sampling=sampling)
    assert [t.token_ids for t in again] == [t.token_ids for t in first]
    # Members of a group differ (each rollout gets its own seed stream).
    assert len({tuple(t.token_ids) for t in first[:4]}) > 1
