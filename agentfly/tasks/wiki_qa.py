"""Questions on the bundled WIKI_MINI encyclopedia, answered with the ``search`` tool.

Each sample is ``{"id", "question", "answer", "passage", "hops", "split"}``; the answer is in the passage
``passage`` (two passages for ``hops: 2``), so searching with the question's keywords finds it. The splits
are fixed in the data: ``train`` and ``test`` never share a question.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

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
