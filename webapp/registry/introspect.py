"""Import a tool or reward by path and describe it. Runs on workers only: it executes user code.

The web process never calls this module; it queues ``webapp.registry.tasks.inspect_entry`` instead, and the
worker runs inspection and "try it" in a child process (``webapp.registry.child``), so a module that hangs,
crashes or has side effects at import time ends that child, not the worker. Only paths the registry's rule
(``webapp.registry.rules``) accepts get here; ``Source`` carries what the rule found, which the import must
match. Django is not needed here (the child has no settings): plugin folders are passed in.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from webapp.registry.plugins import Source, check_import_path, install_team_finder


class IntrospectionError(Exception):
    """The path does not import, or what it names is not a tool/reward. The message is shown to the user."""


@dataclass
class Description:
    name: str
    source_hash: str
    signature: str
    docstring: str
    schema: dict[str, Any] = field(default_factory=dict)
    resource: str = ""
    module_file: str = ""


def plugin_dirs_of(plugin_dirs: list[str] | None) -> list[Path]:
    if plugin_dirs is not None:
        return [Path(d) for d in plugin_dirs]
    from django.conf import settings

    return [Path(d) for d in settings.AGENTFLY_PLUGIN_DIRS]


def add_plugin_dirs(plugin_dirs: list[str] | None = None) -> None:
    """Make the plugin folders importable (idempotent): shared modules by name, after the installed packages
    so a plugin never shadows one, and each team's folder as ``agentfly_teams.<team>`` (``TeamFinder``)."""
    folders = plugin_dirs_of(plugin_dirs)
    for folder in folders:
        path = str(folder.resolve())
        if path not in sys.path:
            sys.path.append(path)
    install_team_finder(folders)


def in_plugin_dir(module: Any, plugin_dirs: list[str] | None = None) -> bool:
    origin = getattr(module, "__file__", None)
    if not origin:
        return False
    path = Path(origin).resolve()
    return any(path.is_relative_to(folder.resolve()) for folder in plugin_dirs_of(plugin_dirs))


def resolve(import_path: str, source: Source | None = None, plugin_dirs: list[str] | None = None) -> Any:
    """The top-level object at ``package.module:name``; IntrospectionError carries the import error text.
    With a ``source``, the module must come from the file the rule located.

    The object must be defined in the module the path names (its ``__module__``, or its function's for a
    Tool or Reward): ``word_tools:system`` after ``from os import system`` is os's function, not the
    plugin's, and is refused like the attribute chain ``word_tools:os.system`` (refused before any import).
    """
    try:
        import_path = check_import_path(import_path)
    except ValueError as exc:
        raise IntrospectionError(str(exc)) from None
    module_name, _, name = import_path.partition(":")
    add_plugin_dirs(plugin_dirs)
    try:
        module: Any = importlib.import_module(module_name)
        if in_plugin_dir(module, plugin_dirs):
            # A team edits its plugin files while workers run: re-read the source so a new version is seen.
            module = importlib.reload(module)
    except BaseException as exc:  # SystemExit and friends from user code must not kill the worker
        raise IntrospectionError(f"importing {module_name!r} failed: {type(exc).__name__}: {exc}") from exc
    origin = getattr(module, "__file__", None)
    if source is not None and (not origin or str(Path(origin).resolve()) != source.module_file):
        raise IntrospectionError(f"{module_name!r} was imported from {origin}, not from {source.module_file} "
                                 "where the registry located it; refusing to use it")
    try:
        obj = inspect.getattr_static(module, name)
    except AttributeError:
        raise IntrospectionError(f"module {module_name!r} has no attribute {name!r}") from None
    home = getattr(getattr(obj, "fn", obj), "__module__", None)
    if callable(obj) and home != module_name:  # what is not callable is refused by ``load`` for its type
        raise IntrospectionError(
            f"{import_path}: {name!r} is not defined in {module_name!r} (it comes from {home or 'elsewhere'!r}); a "
            f"registry path names a function defined in the module itself. Write a tool or reward in {module_name} "
            "that calls it, and register that function."
        )
    return obj


KINDS = {"tool": ("agentfly.tools", "Tool"), "reward": ("agentfly.rewards", "Reward")}


def load(kind: str, import_path: str, source: Source | None = None, plugin_dirs: list[str] | None = None) -> Any:
    """The ``Tool`` (``kind`` "tool") or ``Reward`` ("reward") at ``import_path``: an object decorated with
    ``@agentfly.tool`` / ``@agentfly.reward`` (or made with ``make_tool``/``make_reward``), wherever it lives.
    A plain function is refused, as the rule refuses it from the source: a worker never wraps code its
    author did not declare a tool or reward."""
    if kind not in KINDS:
        raise ValueError(f"Unknown registry kind: {kind!r}; expected 'tool' or 'reward'")
    package, cls_name = KINDS[kind]
    cls = getattr(importlib.import_module(package), cls_name)
    obj = resolve(import_path, source, plugin_dirs)
    if isinstance(obj, cls):
        return obj
    other = "reward" if kind == "tool" else "tool"
    if isinstance(obj, getattr(importlib.import_module(KINDS[other][0]), KINDS[other][1])):
        raise IntrospectionError(f"{import_path} is a {other}, not a {kind}: register it as a {other} entry")
    raise IntrospectionError(
        f"{import_path} is a {type(obj).__name__}, not a {kind} decorated with @agentfly.{kind}; only functions "
        f"decorated as tools and rewards are registrable. Decorate the function with `@{kind}` (`from {package} "
        f"import {kind}`) and register it again."
    )


def source_hash(fn: Any) -> tuple[str, str]:
    """SHA-256 of the function's source (falls back to its qualified name for C functions), and its file."""
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        source = f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', repr(fn))}"
    try:
        module_file = inspect.getsourcefile(fn) or ""
    except TypeError:
        module_file = ""
    return hashlib.sha256(source.encode()).hexdigest(), module_file


def describe(kind: str, import_path: str, source: Source | None = None,
             plugin_dirs: list[str] | None = None) -> Description:
    """Import and describe the tool or reward at ``import_path`` (``kind`` is "tool" or "reward")."""
    if kind == "tool":
        t = load("tool", import_path, source, plugin_dirs)
        digest, module_file = source_hash(t.fn)
        return Description(
            name=t.name,
            source_hash=digest,
            signature=f"{t.fn.__name__}{inspect.signature(t.fn)}",
            docstring=inspect.getdoc(t.fn) or "",
            schema=t.schema,
            resource=t.resource or "",
            module_file=module_file,
        )
    if kind == "reward":
        r = load("reward", import_path, source, plugin_dirs)
        digest, module_file = source_hash(r.fn)
        return Description(
            name=r.name,
            source_hash=digest,
            signature=f"{r.fn.__name__}{inspect.signature(r.fn)}",
            docstring=inspect.getdoc(r.fn) or "",
            schema={"required": list(r.required), "optional": list(r.optional), "takes_all": r.takes_all},
            resource=r.resource or "",
            module_file=module_file,
        )
    raise ValueError(f"Unknown registry kind: {kind!r}; expected 'tool' or 'reward'")


def builtin_paths() -> list[tuple[str, str]]:
    """``(kind, import_path)`` for every tool and reward that ships with AgentFly."""
    from agentfly.rewards import Reward
    from agentfly.rewards import builtin as reward_builtin
    from agentfly.tools import Tool
    from agentfly.tools import builtin as tool_builtin

    found: list[tuple[str, str]] = []
    for module, cls, kind in ((tool_builtin, Tool, "tool"), (reward_builtin, Reward, "reward")):
        for attr in getattr(module, "__all__", dir(module)):
            obj = getattr(module, attr, None)
            if isinstance(obj, cls):
                # Name it by the module that defines it (what configs write), not the re-exporting package.
                home = sys.modules.get(obj.fn.__module__)
                where = obj.fn.__module__ if home is not None and getattr(home, attr, None) is obj else module.__name__  # type: ignore[union-attr]  # a built-in's fn
                found.append((kind, f"{where}:{attr}"))
    return found
