"""Questions on the bundled WIKI_MINI encyclopedia, answered with the ``search`` tool.

Each sample is ``{"id", "question", "answer", "passage", "hops", "split"}``; the answer is in the passage
``passage`` (two passages for ``hops: 2``), so searching with the question's keywords finds it. The splits
are fixed in the data: ``train`` and ``test`` never share a question.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

from agentfly.tasks.base import FlawError, Flaws, Messages, Sample, Task, register

SPLITS = ("train", "test")


def load(split: str = "train") -> list[dict[str, Any]]:
    """The questions of one split, in file order."""
    from agentfly.tasks.io import load_jsonl

    if split not in SPLITS:
        raise ValueError(f"split={split!r}; use one of {SPLITS}")
    path = resources.files("agentfly.retrieval").joinpath("data/wiki_mini_qa.jsonl")
    return [s for s in load_jsonl(str(path)) if s.get("split") == split]


def demonstration(sample: dict[str, Any], answer: str | None = None) -> list[dict[str, Any]]:
    """A worked conversation: search with the question, then answer inside ``<answer>`` tags (what the
    ``exact_match`` and ``f1`` rewards read). ``answer`` overrides the final answer."""
    query = sample["question"].rstrip("?").replace('"', "")
    call = '<tool_call>\n{"name": "search", "arguments": {"query": "' + query + '"}}\n</tool_call>'
    final = answer if answer is not None else sample["answer"]
    return [
        {"role": "user", "content": sample["question"]},
        {"role": "assistant", "content": call},
        {"role": "tool", "content": "", "name": "search"},  # the replay runs the real search
        {"role": "assistant", "content": f"<answer>{final}</answer>"},
    ]


def demonstrations(n: int, seed: int, flaws: Flaws) -> list[tuple[Sample, Messages]]:
    """The first ``n`` training questions (``seed`` is not used: the splits are fixed); a share
    ``flaws.wrong_fraction`` of them answers with another question's answer. The demonstrator has no habits."""
    if flaws.habit_phrasings:
        raise FlawError("habit_phrasings", "habit_phrasings: wiki_qa's demonstrator has no habits, only "
                        "wrong answers (wrong_fraction)")
    samples = load("train")[:n]
    rng = flaws.rng()
    wrong = set(rng.sample(range(len(samples)), round(flaws.wrong_fraction * len(samples))))
    pairs = []
    for i, sample in enumerate(samples):
        answer = None
        if i in wrong:
            others = [o["answer"] for o in rng.sample(samples, min(len(samples), 20)) if o["answer"] != sample["answer"]]
            answer = others[0] if others else "unknown"
        pairs.append((sample, demonstration(sample, answer=answer)))
    return pairs


TASK = register(Task(
    name="wiki_qa", title="Retrieval QA: answer questions by searching a small Wikipedia index (built in)",
    samples=lambda split, n, seed: load(split), tools=("agentfly.tools.builtin.search:search",),
    reward="agentfly.rewards.builtin.qa:exact_match", demonstrations=demonstrations))
