"""Where a ``data.task`` name finds its ``Task``: the registry of built-in tasks, a third-party source, or a
module the user names.

    find_task("arithmetic")                                      # a registered (built-in) task
    find_task("reasoning_gym:chain_sum", {"max_terms": 4})       # any reasoning-gym dataset, its config as options
    find_task("textworld:cooking", {"rooms": [1, 2]})            # TextWorld games generated and compiled per seed
    find_task("my_package.tasks:my_task", {...})                 # a Task, or a factory called with the options

A source task is built once per (name, options) and kept. A bad option raises ``TaskOptionError`` naming the
option, so the config (and the web app's launch form) can put the message on ``data.options.<name>``.
Third-party sources are optional extras: naming one that is not installed says what to install.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from typing import Any

from agentfly.tasks.base import Task, TaskOptionError, UnknownTask, registered, task_names


def _reasoning_gym(dataset: str, options: dict[str, Any]) -> Task:
    from agentfly.tasks.rgym import make_task

    return make_task(dataset, options)


def _textworld(theme: str, options: dict[str, Any]) -> Task:
    from agentfly.tasks.textworld_games import make_task

    return make_task(theme, options)


# Prefix -> builder of the task for what follows the colon. A prefix is not a module path (no dot), so
# ``reasoning_gym:chain_sum`` can never be mistaken for an attribute of a module named ``reasoning_gym``.
SOURCES: dict[str, Callable[[str, dict[str, Any]], Task]] = {
    "reasoning_gym": _reasoning_gym,
    "textworld": _textworld,
}
SOURCE_TITLES = {
    "reasoning_gym": "reasoning_gym:<dataset>: any reasoning-gym dataset, scored by its own scorer "
                     "(options: the dataset's config fields)",
    "textworld": "textworld:<theme>: TextWorld games (cooking, coin, treasure, simple) generated and compiled per "
                 "seed (options: rooms, quest_length, objects)",
}

_BUILT: dict[tuple[str, str], Task] = {}


def source_of(name: str) -> str | None:
    """``"reasoning_gym"``, ``"textworld"``, ``"module"`` (a ``package.module:attribute``) or None (a
    registered task's name, or a path)."""
    prefix, sep, rest = name.partition(":")
    if not sep or not rest:
        return None
    if prefix in SOURCES:
        return prefix
    if "/" in name or "\\" in name or not all(part.isidentifier() for part in prefix.split(".")) \
            or not rest.isidentifier():
        return None  # a path with a colon in it, or a drive letter: not importable
    return "module"


def is_task_name(name: str) -> bool:
    """Whether ``data.task`` names a task (registered, a source, or a module's), as opposed to a JSONL path."""
    return registered(name) is not None or source_of(name) is not None


def find_task(name: str, options: dict[str, Any] | None = None) -> Task | None:
    """The task ``name`` names, or None when it names none (``data.task`` is then a JSONL file).

    Raises ``TaskOptionError`` for an option the task does not take, ``UnknownTask`` for a source's unknown
    dataset or theme, and ``ImportError`` (saying what to install) for a source that is not installed.
    """
    options = dict(options or {})
    task = registered(name)
    if task is not None:
        if options:
            raise TaskOptionError(next(iter(options)), f"the built-in task {name!r} takes no options; remove "
                                  f"data.options ({', '.join(options)})")
        return task
    source = source_of(name)
    if source is None:
        return None
    key = (name, json.dumps(options, sort_keys=True, default=str))
    if key not in _BUILT:
        prefix, _, rest = name.partition(":")
        _BUILT[key] = SOURCES[prefix](rest, options) if source in SOURCES else _from_module(name, options)
    return _BUILT[key]


def get_task(name: str, options: dict[str, Any] | None = None) -> Task:
    """The task ``name`` names; raises ``UnknownTask`` naming the known tasks and sources when it names none."""
    task = find_task(name, options)
    if task is None:
        raise UnknownTask(f"unknown task {name!r}; the known tasks are {', '.join(task_names())}, and the sources "
                          f"{', '.join(f'{p}:<name>' for p in SOURCES)} and 'package.module:attribute'")
    return task


def _from_module(name: str, options: dict[str, Any]) -> Task:
    """``package.module:attribute``: a ``Task``, or a callable that takes the options as keywords and returns one."""
    module_name, _, attr = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UnknownTask(f"data.task {name!r}: cannot import {module_name!r} ({exc}); put the module on the "
                          "Python path or install its package") from None
    try:
        obj = getattr(module, attr)
    except AttributeError:
        raise UnknownTask(f"data.task {name!r}: module {module_name!r} has no attribute {attr!r}") from None
    if isinstance(obj, Task):
        if options:
            raise TaskOptionError(next(iter(options)), f"{name} is a Task, which takes no options; remove "
                                  "data.options, or name a function that builds the Task from them")
        return obj
    if not callable(obj):
        raise UnknownTask(f"data.task {name!r} is a {type(obj).__name__}, not an agentfly.tasks.Task or a function "
                          "that returns one")
    try:
        task = obj(**options)
    except TypeError as exc:
        raise TaskOptionError("", f"{name} did not take data.options {sorted(options)}: {exc}") from None
    if not isinstance(task, Task):
        raise UnknownTask(f"data.task {name!r} returned a {type(task).__name__}, not an agentfly.tasks.Task")
    return task
