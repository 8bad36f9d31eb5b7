"""Key chains: find the value at the end of a chain of keys, one ``lookup`` per link.

Each sample is ``{"id", "question", "start", "links", "answer", "hops"}``: the question names the start key;
``links`` maps each key to the next (``k42 -> k7 -> k63``), and the last key holds the 3-digit ``answer``.
``hops`` (3 to 5) is the number of lookups the answer needs, each one's argument read from the previous
observation, so full reward takes at least 3 dependent tool turns. Keys are ``k10``..``k99`` and values
100..999, so neither the value nor a later key can be guessed from the question.

    python -m agentfly.tasks.key_chain --n 500 --split test --out runs/chain-test.jsonl
"""

from __future__ import annotations

import itertools
import random
from typing import Any

from agentfly.tasks.base import FlawError, Flaws, Messages, Sample, Task, register, wrong_answer

MIN_HOPS, MAX_HOPS = 3, 5

TEMPLATES = (
    "What is the value at the end of the chain from key {k}?",
    "Follow the keys from {k} and give the final value.",
    "Start at key {k}. What value does the chain end in?",
    "Find the final value reached from key {k}.",
    "Look up {k} and follow the chain to its value.",
)


def make_chain(rng: random.Random, hops: int) -> tuple[list[str], str]:
    keys = [f"k{n}" for n in rng.sample(range(10, 100), hops)]
    return keys, str(rng.randint(100, 999))


LONG_MIN_HOPS, LONG_MAX_HOPS = 6, 10  # the long-horizon variant (``data.task: key_chain_long``)


def generate(n: int, seed: int = 0, split: str = "train", min_hops: int = MIN_HOPS,
             max_hops: int = MAX_HOPS) -> list[dict[str, Any]]:
    """``n`` problems of ``min_hops``..``max_hops`` links; different ``split`` names give disjoint random streams
    for the same seed (and the long variant its own)."""
    name = "key_chain" if (min_hops, max_hops) == (MIN_HOPS, MAX_HOPS) else f"key_chain:{min_hops}-{max_hops}"
    rng = random.Random(f"{name}:{split}:{seed}")
    samples = []
    for i in range(n):
        hops = rng.randint(min_hops, max_hops)
        keys, value = make_chain(rng, hops)
        question = rng.choice(TEMPLATES).format(k=keys[0])
        samples.append({"id": f"{split}-{seed}-{i}", "question": question, "start": keys[0],
                        "links": dict(itertools.pairwise(keys)), "answer": value, "hops": hops})
    return samples


def chain_keys(sample: dict[str, Any]) -> list[str]:
    """The sample's keys in walking order."""
    keys = [sample["start"]]
    while keys[-1] in sample["links"]:
        keys.append(sample["links"][keys[-1]])
    return keys


def call(key: str) -> str:
    return '<tool_call>\n{"name": "lookup", "arguments": {"key": "' + key + '"}}\n</tool_call>'


def demonstration(sample: dict[str, Any], stop_after: int | None = None) -> list[dict[str, Any]]:
    """A worked conversation in the Hermes format: look up each key in turn, then answer with the value.

    ``stop_after=h`` (h < the sample's hops) is the impatient demonstrator: it answers after ``h`` lookups,
    with the number of the last key it was given (always wrong: keys have two digits, values three).
    """
    keys = chain_keys(sample)
    hops = len(keys) if stop_after is None else min(stop_after, len(keys))
    messages: list[dict[str, Any]] = [{"role": "user", "content": sample["question"]}]
    for i in range(hops):
        observation = f"next: {keys[i + 1]}" if i + 1 < len(keys) else f"final: {sample['answer']}"
        messages += [{"role": "assistant", "content": call(keys[i])},
                     {"role": "tool", "content": observation, "name": "lookup"}]
    final = sample["answer"] if hops == len(keys) else keys[hops].removeprefix("k")
    messages.append({"role": "assistant", "content": f"The answer is {final}."})
    return messages


def demonstrations(n: int, seed: int, flaws: Flaws) -> list[tuple[Sample, Messages]]:
    """``n`` demonstrations from the 'sft' stream: every one follows the chain key by key, except a share
    ``flaws.habit_fraction`` of the questions opening with one of ``flaws.habit_phrasings``, where the impatient
    demonstrator answers after ``flaws.habit_lookups`` lookups (habit ``early_answer``) with the number of the
    last key it was given, and a share ``flaws.wrong_fraction`` of the others, whose answer has one wrong digit."""
    if flaws.habit_phrasings and flaws.habit != "early_answer":
        raise FlawError("habit", f"habit={flaws.habit!r} is not a key_chain habit; key_chain's is early_answer")
    if flaws.habit_lookups >= MIN_HOPS:
        raise FlawError("habit_lookups", f"habit_lookups={flaws.habit_lookups} must be below the shortest chain "
                        f"({MIN_HOPS} hops), or the impatient answer would be right")
    samples = generate(n, seed=seed, split="sft")
    rng = flaws.rng()
    habitual, wrong = flaws.pick(samples, rng)
    pairs = []
    for i, sample in enumerate(samples):
        messages = demonstration(sample, stop_after=flaws.habit_lookups if i in habitual else None)
        if i in wrong:
            messages[-1] = {"role": "assistant", "content": f"The answer is {wrong_answer(sample['answer'], rng)}."}
        pairs.append((sample, messages))
    return pairs


TOOLS, REWARD = ("agentfly.tools.builtin.lookup:lookup",), "agentfly.rewards.builtin.chain:chain_answer"
TASK = register(Task(
    name="key_chain",
    title="Key chain: follow keys through the rollout's key-value store (generated, multi-turn)",
    samples=lambda split, n, seed: generate(n, seed=seed, split=split), tools=TOOLS, reward=REWARD,
    demonstrations=demonstrations, habits=("early_answer",)))
LONG_TASK = register(Task(
    name="key_chain_long",
    title=f"Long key chain: {LONG_MIN_HOPS}-{LONG_MAX_HOPS} keys, for per-turn credit (generated, multi-turn)",
    samples=lambda split, n, seed: generate(n, seed=seed, split=split, min_hops=LONG_MIN_HOPS,
                                            max_hops=LONG_MAX_HOPS),
    tools=TOOLS, reward=REWARD))


def main(argv: list[str] | None = None) -> None:
    from agentfly.tasks.io import generator_main

    generator_main(generate, (__doc__ or "").splitlines()[0], argv)


if __name__ == "__main__":
    main()
