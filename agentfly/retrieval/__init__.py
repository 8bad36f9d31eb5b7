"""Retrieval: a BM25 index (``bm25s``) as a global resource, and WIKI_MINI, a corpus shipped in the repo."""

from agentfly.retrieval.index import WIKI_MINI, BM25Index, Hit, load_passages, wiki_mini_qa

__all__ = ["WIKI_MINI", "BM25Index", "Hit", "load_passages", "wiki_mini_qa"]
