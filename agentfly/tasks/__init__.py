"""Task datasets: lists of samples (dicts) with at least a ``question`` (or ``prompt``/``messages``)."""

from agentfly.tasks.io import load_jsonl, save_jsonl

__all__ = ["load_jsonl", "save_jsonl"]
