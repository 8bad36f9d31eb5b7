"""The one rule of what a registry entry may name. Every place that is about to trust an import path calls
``check_registrable``: registration (form and API), the worker before it imports, the launch form, a job
when it starts, and the sweep a worker runs when it starts.

An entry resolves to a top-level object defined in the module it names and made with ``@agentfly.tool``
(a tool entry) or ``@agentfly.reward`` (a reward entry), or with ``make_tool``/``make_reward``, in
(a) AgentFly's built-ins (``agentfly.tools.builtin``, ``agentfly.rewards.builtin``) or a package named in
    ``AGENTFLY_TOOL_PACKAGES``; or
(b) a module whose file lies inside one of ``AGENTFLY_PLUGIN_DIRS``: a shared module, or a module in the
    team's own folder ``<dir>/<team-slug>/`` (see ``webapp.registry.plugins`` for how those are named and
    imported).
Anything else (``os:system``, ``builtins:eval``, a plain function anywhere, a file that escapes its folder
by a symlink) is refused with a message naming the setting to change or the decorator to add.

Nothing here imports the module it judges: files are located on disk and the object's definition is read
with ``ast``. The worker adds the checks only an import can make (the object really is a Tool/Reward whose
function is defined in that module; the module came from the file located here).
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Sequence
from pathlib import Path

from django.conf import settings

from webapp.registry.models import check_import_path
from webapp.registry.plugins import (
    TEAM_PACKAGE,
    Source,
    found_elsewhere,
    is_shared_package,
    module_files,
    resolved_inside,
    team_folders,
    team_package,
)

BUILTIN_PACKAGES = ("agentfly.tools.builtin", "agentfly.rewards.builtin")
# The names a decorated definition is made with, by kind (``@tool``, ``@af.tool(...)``, ``x = make_tool(f)``).
MAKERS = {"tool": {"tool", "make_tool", "Tool"}, "reward": {"reward", "make_reward", "Reward"},
          # A job's ``data.task`` named as 'module:attribute' (agentfly.tasks.sources): a Task made at the top of the
          # module, ``numbers = Task(...)`` or ``numbers = register(Task(...))``; never a function to call.
          "task": {"Task", "register"}}


class NotRegistrable(ValueError):
    """The import path names code the registry does not run; the message says which setting allows it."""


def check_registrable(kind: str, import_path: str, team_slug: str | None) -> Source:
    """Where ``import_path`` (a ``kind`` entry of the team ``team_slug``; None for built-ins) resolves, or
    NotRegistrable saying why not and which setting to change."""
    if kind not in MAKERS:
        raise ValueError(f"Unknown registry kind: {kind!r}; expected 'tool', 'reward' or 'task'")
    try:
        import_path = check_import_path(import_path)
    except ValueError as exc:
        raise NotRegistrable(str(exc)) from None
    module, _, attr = import_path.partition(":")
    plugin_dirs = [Path(d) for d in settings.AGENTFLY_PLUGIN_DIRS]
    if module.split(".")[0] == TEAM_PACKAGE:
        return _team_module(kind, import_path, module, team_slug, plugin_dirs)
    for package in (*BUILTIN_PACKAGES, *settings.AGENTFLY_TOOL_PACKAGES):
        if module == package or module.startswith(package + "."):
            return _package_object(kind, import_path, module, attr)
    source = _shared_module(kind, import_path, module, plugin_dirs)
    if source is not None:
        return source
    raise NotRegistrable(
        f"{import_path} is not registrable code: {module!r} is neither a module in a plugin folder "
        f"(AGENTFLY_PLUGIN_DIRS: {_listed(plugin_dirs)}) nor part of a tool package (AgentFly's built-ins, or "
        f"AGENTFLY_TOOL_PACKAGES: {_listed(settings.AGENTFLY_TOOL_PACKAGES)}). Put the module into a plugin "
        "folder, or ask the operator to add its package to AGENTFLY_TOOL_PACKAGES (only objects decorated with "
        "@agentfly.tool or @agentfly.reward are taken)."
    )


def check_job_config(config: dict[str, object], team_slug: str | None) -> None:
    """Check every tool and the reward a trainer config names, and a task it names as 'module:attribute', as a
    job of team ``team_slug``. (A task source such as ``reasoning_gym:<dataset>`` is installed code the trainer
    builds itself.)"""
    from agentfly.tasks import source_of

    data = config.get("data") or {}
    assert isinstance(data, dict)
    if source_of(str(data.get("task", ""))) == "module":
        check_registrable("task", str(data["task"]), team_slug)
    rollout = config.get("rollout") or {}
    assert isinstance(rollout, dict)
    for path in rollout.get("tools") or []:
        check_registrable("tool", str(path), team_slug)
    if rollout.get("reward"):
        check_registrable("reward", str(rollout["reward"]), team_slug)


def _listed(items: Sequence[object]) -> str:
    return ", ".join(str(i) for i in items) if items else "none set"


# ----------------------------------------------------------------------------------- (b) plugin folders
def _team_module(kind: str, import_path: str, module: str, team_slug: str | None, plugin_dirs: list[Path]) -> Source:
    parts = module.split(".")
    if team_slug is None:
        raise NotRegistrable(f"{import_path}: a built-in entry cannot come from a team's plugin folder")
    own = team_package(team_slug)
    if len(parts) < 3 or ".".join(parts[:2]) != own:
        raise NotRegistrable(
            f"{import_path} is not in your team's plugin folder: team {team_slug!r} registers its own modules "
            f"as {own}.<module>:<function>, from the folder <plugin dir>/{team_slug}/ "
            f"(AGENTFLY_PLUGIN_DIRS: {_listed(plugin_dirs)}); another team's folder is theirs alone"
        )
    folders = team_folders(parts[1], plugin_dirs)
    if len(folders) > 1:
        raise NotRegistrable(f"{import_path}: the folders {', '.join(map(str, folders))} both claim {own}; "
                             "the operator must keep only the one named exactly like the team's slug")
    shared = [d / team_slug for d in plugin_dirs if is_shared_package(d / team_slug)]
    if not folders and shared:
        raise NotRegistrable(f"{import_path}: {shared[0]} is a shared plugin package (it has __init__.py), which "
                             f"every team imports as {team_slug.replace('-', '_')}; it is not team {team_slug!r}'s "
                             "folder. The operator renames the team or the package to give the team a folder.")
    if not folders or folders[0].name != team_slug:
        raise NotRegistrable(f"{import_path}: team {team_slug!r} has no plugin folder; the operator creates "
                             f"<plugin dir>/{team_slug}/ in one of AGENTFLY_PLUGIN_DIRS ({_listed(plugin_dirs)})")
    files = module_files([folders[0]], parts[2:])
    if files is None:
        raise NotRegistrable(f"{import_path}: there is no module {'.'.join(parts[2:])!r} in {folders[0]}/")
    _refuse_escape(import_path, files, folders[0])
    _refuse_undecorated(kind, import_path, files[-1])
    return Source("plugin", str(files[-1].resolve()))


def _shared_module(kind: str, import_path: str, module: str, plugin_dirs: list[Path]) -> Source | None:
    parts = module.split(".")
    for folder in plugin_dirs:
        files = module_files([folder], parts)
        if files is None:
            continue
        _refuse_escape(import_path, files, folder)
        from webapp.accounts.models import Team

        # A team's folder is its own; a shared package (it has __init__.py) stays shared whatever teams are called.
        if ((folder / parts[0]).is_dir() and not is_shared_package(folder / parts[0])
                and Team.objects.filter(slug=parts[0]).exists()):
            raise NotRegistrable(f"{import_path}: {folder / parts[0]} is team {parts[0]!r}'s folder; only that "
                                 f"team registers from it, as {team_package(parts[0])}.<module>:<function>")
        elsewhere = found_elsewhere(parts[0], plugin_dirs)
        if elsewhere is not None:
            raise NotRegistrable(f"{import_path}: the plugin module {parts[0]!r} has the name of a module that "
                                 f"is already installed ({elsewhere}), which workers would import instead; "
                                 "rename the plugin")
        _refuse_undecorated(kind, import_path, files[-1])
        return Source("plugin", str(files[-1].resolve()))
    return None


def _refuse_undecorated(kind: str, import_path: str, file: Path, package: bool = False) -> None:
    """The name must be bound, at the top of ``file``, by a definition decorated (or made) as a ``kind``.

    ``word_tools:system`` after ``from os import system`` in word_tools is os's function: refused here from
    the source, and again on the worker from the object's ``__module__``. A plain function is refused too (a
    registry entry is code its author declared a tool or reward); the worker checks the imported object's
    type again."""
    module, _, name = import_path.partition(":")
    try:
        tree = ast.parse(file.read_text(encoding="utf-8"), str(file))
    except (OSError, SyntaxError, ValueError) as exc:
        raise NotRegistrable(f"{import_path}: {file} cannot be read as Python ({type(exc).__name__}: {exc}); "
                             "fix the module and register it again") from None
    binding = _binding(tree, name, kind)
    if binding == "decorated":
        return
    if kind == "task":
        raise NotRegistrable(f"{import_path} is not a Task made at the top of {module!r}: a job's data.task names a "
                             f"module attribute bound as `{name} = Task(...)` (from agentfly.tasks import Task), not "
                             "a function or anything imported; the web app runs no other code to build a task")
    if binding == "imported":
        raise NotRegistrable(f"{import_path}: {name!r} is imported into {module!r}, not defined there; a registry "
                             f"path names a {kind} defined in the module itself. Write a {kind} in {module} that "
                             "calls it, and register that function.")
    if binding == "missing":
        raise NotRegistrable(f"{import_path}: {module!r} defines no top-level {name!r}; a registry path names a "
                             f"function defined at the top of the module and decorated with @agentfly.{kind}")
    other = "reward" if kind == "tool" else "tool"
    if _binding(tree, name, other) == "decorated":
        raise NotRegistrable(f"{import_path} is decorated as a {other}, not a {kind}: register it as a {other} "
                             f"entry, or decorate a function with @agentfly.{kind} to register a {kind}")
    function = any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name
                   for node in tree.body)
    if package:
        where = (f"decorate it in its package, or write a {kind} in a plugin folder module (AGENTFLY_PLUGIN_DIRS) "
                 "that calls it")
    elif function:
        where = f"write `from agentfly.{kind}s import {kind}` in {module} and put `@{kind}` on the line above `def {name}`"
    else:
        where = f"make {name} a function in {module} decorated with `@{kind}` (`from agentfly.{kind}s import {kind}`)"
    raise NotRegistrable(f"{import_path} is not an object decorated with @agentfly.{kind}: only functions "
                         f"decorated as tools and rewards are registrable. To register it, {where}.")


def _refuse_escape(import_path: str, files: list[Path], folder: Path) -> None:
    outside = resolved_inside(files, folder)
    if outside is not None:
        raise NotRegistrable(f"{import_path}: {outside} resolves to {outside.resolve()}, outside the plugin "
                             f"folder {folder}; only files inside AGENTFLY_PLUGIN_DIRS are registrable (copy "
                             "the module into the folder instead of linking to it)")


# ----------------------------------------------------------------------------------- (a) tool packages
def _package_object(kind: str, import_path: str, module: str, attr: str) -> Source:
    file = locate_installed(module)
    if file is None:
        raise NotRegistrable(f"{import_path}: there is no module {module!r} installed on this server")
    _refuse_undecorated(kind, import_path, file, package=True)
    return Source("package", str(file.resolve()))


def locate_installed(module: str) -> Path | None:
    """The file of an installed module, found without importing it or its parents. (``find_spec`` of a
    dotted name imports the parent packages; of a top-level name it only looks.)"""
    top, *rest = module.split(".")
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations is None:
        return Path(spec.origin) if not rest and spec.origin and spec.origin.endswith(".py") else None
    if not rest:
        init = Path(spec.origin) if spec.origin else None
        return init if init is not None and init.is_file() and init.suffix == ".py" else None
    files = module_files([Path(p) for p in spec.submodule_search_locations], rest)
    return files[-1] if files and files[-1].suffix == ".py" else None


def _binding(tree: ast.Module, attr: str, kind: str) -> str:
    """How the last top-level binding of ``attr`` in a module's syntax tree is made: "decorated" (a definition
    decorated or made as a ``kind``), "imported" (``from x import attr``: defined elsewhere, which the worker
    refuses as its ``__module__`` is not this module), "missing" (no top-level binding), or "other"."""
    binding: ast.stmt | None = None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == attr:
            binding = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == attr for t in targets):
                binding = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)) and any(
                (alias.asname or alias.name.split(".")[0]) == attr for alias in node.names):
            binding = node
    if isinstance(binding, (ast.Import, ast.ImportFrom)):
        return "imported"
    if isinstance(binding, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return "decorated" if any(_maker(d) in MAKERS[kind] for d in binding.decorator_list) else "other"
    if isinstance(binding, (ast.Assign, ast.AnnAssign)):
        return "decorated" if isinstance(binding.value, ast.Call) and _maker(binding.value) in MAKERS[kind] else "other"
    return "missing" if binding is None else "other"


def _maker(node: ast.expr) -> str:
    """The name a decorator or call is made with: ``tool``, ``af.tool``, ``tool(...)``, ``tool(...)(fn)``."""
    while isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""
