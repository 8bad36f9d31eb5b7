"""``BM25Index``: keyword search over a passage corpus with ``bm25s``, held as a global resource.

One index serves every rollout of a job (``scope="global"``): it is read-only, so there is nothing to
reset and no reason to build it twice. ``search`` is a sparse-matrix lookup of about a millisecond, so it
runs on the event loop; building the index (a second for WIKI_MINI) runs in a worker thread.

    index = BM25Index(corpus="path/to/passages.jsonl")   # {"id", "title", "text"} per line
    await index.start()
    hits = await index.search("Who founded Brelford?", k=3)
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentfly.resources.builtin import register_builtin
from agentfly.resources.spec import Pool, ResourceSpec


@dataclass(frozen=True)
class Hit:
    id: str
    title: str
    text: str
    score: float


def load_passages(path: str | Path) -> list[dict[str, Any]]:
    """Passages from a JSONL file; each line needs "text" (and may have "id", "title")."""
    passages = []
    with Path(path).open() as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            if not isinstance(row.get("text"), str):
                raise ValueError(f"{path}:{n}: a passage needs a string 'text' field, got keys {sorted(row)}")
            row.setdefault("id", f"{n}")
            row.setdefault("title", "")
            passages.append(row)
    if not passages:
        raise ValueError(f"{path}: no passages; the corpus file is empty")
    return passages


class BM25Index:
    """A BM25 index over a passage corpus. Options: ``corpus`` (a JSONL path), ``k1``, ``b``."""

    kind = "index"

    def __init__(self, spec: Any = None, *, corpus: str | Path | None = None, k1: float = 1.5, b: float = 0.75) -> None:
        options = dict(getattr(spec, "options", None) or {})
        self.corpus_path = Path(corpus or options.get("corpus") or Path(__file__).with_name("data") / "wiki_mini.jsonl")
        self.k1 = float(options.get("k1", k1))
        self.b = float(options.get("b", b))
        self.passages: list[dict[str, Any]] = []
        self.retriever: Any = None
        self.closed = False

    def _build(self) -> None:
        import bm25s

        self.passages = load_passages(self.corpus_path)
        tokens = bm25s.tokenize([f"{p['title']} {p['text']}" for p in self.passages], stopwords="en",
                                show_progress=False)
        retriever = bm25s.BM25(k1=self.k1, b=self.b)
        retriever.index(tokens, show_progress=False)
        self.retriever = retriever

    async def start(self) -> None:
        await asyncio.to_thread(self._build)

    def search_sync(self, query: str, k: int = 3) -> list[Hit]:
        import bm25s

        if self.retriever is None or self.closed:
            raise RuntimeError("the index is not started (or was closed)")
        if not query.strip():
            raise ValueError("empty query: say what to search for")
        k = max(1, min(int(k), 20, len(self.passages)))
        tokens = bm25s.tokenize([query], stopwords="en", show_progress=False)
        if not tokens.ids or not tokens.ids[0]:
            return []
        docs, scores = self.retriever.retrieve(tokens, k=k, show_progress=False, n_threads=1)
        hits = []
        for i, score in zip(docs[0], scores[0], strict=True):
            if score <= 0:
                continue
            p = self.passages[int(i)]
            hits.append(Hit(p["id"], p["title"], p["text"], float(score)))
        return hits

    async def search(self, query: str, k: int = 3) -> list[Hit]:
        return self.search_sync(query, k)

    async def reset(self) -> None:
        """Read-only: nothing to reset."""

    async def health(self) -> bool:
        return self.retriever is not None and not self.closed

    async def close(self) -> None:
        self.closed = True
        self.retriever = None

    def kill(self) -> None:
        self.closed = True

    def isolation(self) -> dict[str, Any]:
        return {"passages": len(self.passages), "corpus": self.corpus_path.name}


WIKI_MINI = register_builtin(ResourceSpec(
    name="wiki",
    factory=BM25Index,
    kind="index",
    backend="inprocess",
    pool=Pool(min=1, max=1),
    scope="global",
    acquire_timeout=120,
))


def wiki_mini_qa(split: str = "train", hops: int | None = None, limit: int | None = None) -> list[dict[str, Any]]:
    """Question-answer samples about WIKI_MINI: {"id", "question", "answer", "passage", "hops", "split"}."""
    from agentfly.retrieval.corpus import QA_PATH

    if split not in ("train", "test", "all"):
        raise ValueError(f"split={split!r}; use 'train', 'test' or 'all'")
    rows = [json.loads(line) for line in QA_PATH.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if (split == "all" or r["split"] == split) and (hops is None or r["hops"] == hops)]
    return rows[:limit] if limit is not None else rows
