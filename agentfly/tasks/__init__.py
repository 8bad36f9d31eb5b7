"""Tasks: each a module that registers one ``Task`` (its samples, demonstrations, tools and reward) under the
name ``data.task`` gives; importing this package registers the built-in ones. Samples are dicts with at least
a ``question`` (or ``prompt``/``messages``).

    from agentfly.tasks import get_task
    task = get_task("arithmetic")
    train = task.samples("train", 1000, 0)
"""

# The built-in tasks register themselves when imported.
from agentfly.tasks import arithmetic, code_repair, key_chain, scienceworld, wiki_qa
from agentfly.tasks.base import (
    FlawError,
    Flaws,
    Task,
    UnknownTask,
    find_task,
    get_task,
    register,
    task_names,
    tasks,
)
from agentfly.tasks.io import load_jsonl, save_jsonl

__all__ = ["FlawError", "Flaws", "Task", "UnknownTask", "arithmetic", "code_repair", "find_task", "get_task", "key_chain",
           "load_jsonl", "register", "save_jsonl", "scienceworld", "task_names", "tasks", "wiki_qa"]
