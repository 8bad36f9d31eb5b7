"""The key-chain task's store under the resource layer: a ``scope="rollout"`` resource that the ``lookup``
tool acquires on a rollout's first call, keeps (with the walk's state) for its later turns, and that is reset
when the rollout releases it; and the task's rollouts scored by ``chain_answer`` with scripted turns."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

import agentfly as af
from agentfly.context import RolloutContext
from agentfly.rewards.builtin.chain import chain_answer
from agentfly.tasks import key_chain
from agentfly.tools.builtin.lookup import KEY_CHAIN, RESOURCE, KeyChainStore, lookup

SAMPLE = {"id": "s1", "question": "Follow the keys from k11 and give the final value.", "start": "k11",
          "links": {"k11": "k22", "k22": "k33"}, "answer": "444", "hops": 3}
OTHER = {"id": "s2", "question": "Start at key k50. What value does the chain end in?", "start": "k50",
         "links": {"k50": "k60", "k60": "k70", "k70": "k80"}, "answer": "999", "hops": 4}


def context(engine: af.ResourceEngine, sample: dict[str, Any], rollout_id: str) -> RolloutContext:
    return RolloutContext(sample=sample, rollout_id=rollout_id, group_id=rollout_id, resources=engine)


async def test_one_rollout_keeps_its_store_and_the_walk_across_turns() -> None:
    async with af.ResourceEngine([KEY_CHAIN]) as engine:
        ctx = context(engine, SAMPLE, "r1")
        observations = [(await lookup.invoke({"key": k}, context=ctx)).observation for k in ("k11", "k22", "k33")]
        assert observations == ["next: k22", "next: k33", "final: 444"]
        store = await ctx.resource(RESOURCE)
        assert (store.lookups, store.position, store.done) == (3, 2, True)
        assert engine.stats()[RESOURCE]["acquires"] == 1  # acquired on the first lookup, reused after
        await ctx.aclose()


async def test_a_key_not_yet_reached_is_refused_so_the_chain_must_be_walked_in_order() -> None:
    async with af.ResourceEngine([KEY_CHAIN]) as engine:
        ctx = context(engine, SAMPLE, "r1")
        skipped = await lookup.invoke({"key": "k33"}, context=ctx)  # the last key, without the walk to it
        assert skipped.error is not None and "final" not in skipped.observation
        assert (await lookup.invoke({"key": "k11"}, context=ctx)).observation == "next: k22"
        store = await ctx.resource(RESOURCE)
        assert (store.lookups, store.position, store.done) == (2, 1, False)  # the failed call is counted too
        await ctx.aclose()


async def test_a_released_store_is_reset_before_the_next_rollout_gets_it() -> None:
    async with af.ResourceEngine([KEY_CHAIN.replace(pool=af.Pool(min=0, max=1))]) as engine:
        first = context(engine, SAMPLE, "r1")
        await lookup.invoke({"key": "k11"}, context=first)
        store = await first.resource(RESOURCE)
        await first.aclose()
        await engine.settle()
        second = context(engine, OTHER, "r2")
        assert (await lookup.invoke({"key": "k50"}, context=second)).observation == "next: k60"
        again = await second.resource(RESOURCE)
        assert again is store and store.resets == 1  # the one instance, reset in between
        assert (store.seed_id, store.lookups, store.position) == ("s2", 1, 1)
        await second.aclose()


async def test_concurrent_rollouts_never_share_a_store() -> None:
    async with af.ResourceEngine([KEY_CHAIN]) as engine:
        a, b = context(engine, SAMPLE, "a"), context(engine, OTHER, "b")

        async def walk(ctx: RolloutContext, keys: list[str]) -> list[str]:
            out = []
            for key in keys:
                out.append((await lookup.invoke({"key": key}, context=ctx)).observation)
                await asyncio.sleep(0)  # let the other rollout's call run in between
            return out

        got = await asyncio.gather(walk(a, key_chain.chain_keys(SAMPLE)), walk(b, key_chain.chain_keys(OTHER)))
        assert got == [["next: k22", "next: k33", "final: 444"], ["next: k60", "next: k70", "next: k80", "final: 999"]]
        store_a, store_b = await a.resource(RESOURCE), await b.resource(RESOURCE)
        assert store_a is not store_b and (store_a.lookups, store_b.lookups) == (3, 4)
        await a.aclose()
        await b.aclose()


async def test_a_chain_that_loops_or_breaks_off_is_refused() -> None:
    store = KeyChainStore()
    await store.start()
    with pytest.raises(ValueError, match="loops"):
        store.seed("x", "k1", {"k1": "k2", "k2": "k1"}, "100")
    with pytest.raises(ValueError, match="one chain"):
        store.seed("x", "k1", {"k1": "k2", "k5": "k6"}, "100")


def walker(stop_after: int | None = None, answer: str | None = None):
    """A scripted agent: looks up each key it is given (the start key from the question), then answers with
    the final value; ``stop_after`` answers early, ``answer`` answers at once without any lookup."""

    def script(prompt: str) -> str:
        if answer is not None:
            return f"The answer is {answer}."
        observations = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", prompt)
        if observations and observations[-1].startswith("final: "):
            return f"The answer is {observations[-1].removeprefix('final: ')}."
        if stop_after is not None and len(observations) >= stop_after:
            return "The answer is 22."
        key = observations[-1].removeprefix("next: ") if observations else re.search(r"key (k\d+)", prompt).group(1)
        return key_chain.call(key)

    return script


async def run(tokenizer: Any, script: Any, samples: list[dict[str, Any]]) -> list[Any]:
    async with af.ResourceEngine([KEY_CHAIN]) as engine:
        agent = af.Agent(model=af.ReplayEngine(tokenizer, script), tools=[lookup], reward=chain_answer,
                         resources=engine, max_turns=6)
        trajectories = await agent.run(samples)
        await engine.settle()
        assert engine.stats()[RESOURCE]["in_use"] == 0  # every store went back to the pool
        return trajectories


async def test_a_scripted_rollout_that_makes_three_dependent_lookups_gets_full_reward(tiny_tokenizer: Any) -> None:
    (traj,) = await run(tiny_tokenizer, walker(), [{**SAMPLE, "question": "Find the final value reached from key k11."}])
    assert traj.error is None and traj.finish_reason == "answer"
    assert [c.arguments for c in traj.tool_calls] == [{"key": "k11"}, {"key": "k22"}, {"key": "k33"}]
    assert [c.observation for c in traj.tool_calls] == ["next: k22", "next: k33", "final: 444"]
    assert traj.reward == 1.0 and traj.reward_metrics == {"lookups": 3.0, "reached_final": 1.0}


async def test_answering_early_or_guessing_the_value_without_the_walk_earns_nothing(tiny_tokenizer: Any) -> None:
    sample = {**SAMPLE, "question": "Find the final value reached from key k11."}
    (early,) = await run(tiny_tokenizer, walker(stop_after=2), [sample])
    assert len(early.tool_calls) == 2 and early.reward == 0.0
    (guess,) = await run(tiny_tokenizer, walker(answer="444"), [sample])  # the right number, never looked up
    assert guess.tool_calls == [] and guess.reward == 0.0


def test_train_and_test_problems_are_disjoint_and_need_three_to_five_lookups() -> None:
    train, test = key_chain.generate(2000, split="train"), key_chain.generate(500, split="test")
    assert not {(s["start"], s["answer"], tuple(s["links"].items())) for s in train} & {
        (s["start"], s["answer"], tuple(s["links"].items())) for s in test}
    assert {s["hops"] for s in train} == {3, 4, 5}
    for s in train[:200]:
        assert len(key_chain.chain_keys(s)) == s["hops"] == len(s["links"]) + 1
        assert s["start"] in s["question"] and len(s["answer"]) == 3
