"""Tasks: each a module that registers one ``Task`` (its samples, demonstrations, tools and reward) under the
name ``data.task`` gives; importing this package registers the built-in ones. Samples are dicts with at least
a ``question`` (or ``prompt``/``messages``). ``find_task`` also builds tasks from third-party sources
(``reasoning_gym:<dataset>``, ``textworld:<theme>``) and from a module the user names (``package.module:attr``).

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
    TaskOptionError,
    UnknownTask,
    register,
    registered,
    task_names,
    tasks,
)
from agentfly.tasks.io import load_jsonl, save_jsonl
from agentfly.tasks.sources import (
    SOURCE_TITLES,
    find_task,
    get_task,
    is_task_name,
    source_of,
)

__all__ = ["SOURCE_TITLES", "FlawError", "Flaws", "Task", "TaskOptionError", "UnknownTask", "arithmetic",
           "code_repair", "find_task", "get_task", "is_task_name", "key_chain", "load_jsonl", "register",
           "registered", "save_jsonl", "scienceworld", "source_of", "task_names", "tasks", "wiki_qa"]
