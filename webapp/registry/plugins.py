"""Where plugin modules live on disk, found without importing anything, and how workers import team modules.

Two kinds of plugin folder content (``AGENTFLY_PLUGIN_DIRS``):

- a **shared** module, ``<dir>/word_tools.py`` or ``<dir>/word_tools/__init__.py``: every team may register
  it, as ``word_tools:count``. Workers append the plugin folders to ``sys.path`` (after the installed
  packages, so a plugin never shadows an installed module);
- a **team** module, ``<dir>/<team-slug>/word_tools.py``: only that team may register it, under the package
  ``agentfly_teams.<team-slug with - written _>``, e.g. ``agentfly_teams.team_a.word_tools:count``. Two
  teams' ``word_tools`` never collide: each lives in its own package. ``TeamFinder`` (installed on workers
  and in their child processes by ``webapp.registry.introspect.add_plugin_dirs``) maps that package to the
  team's folder, so ``importlib.import_module`` finds it, including the trainer's ``import_object`` when a
  job runs. Inside a team folder, import sibling modules relatively (``from . import helpers``).

This module imports neither Django nor user code: the registry's rule (``webapp.registry.rules``) runs it
in the web process, and the child process that imports user code runs it too.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

TEAM_PACKAGE = "agentfly_teams"


IMPORT_PATH_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")
ATTRIBUTE_CHAIN_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")


def check_import_path(path: str) -> str:
    """Return ``path`` stripped, or raise ValueError saying what a valid one looks like.

    A path names one top-level object of one module (``module:name``). An attribute chain after the colon
    (``word_tools:os.system``, ``word_tools:__loader__.get_data``) would walk from a harmless module to
    whatever it imported, so it is refused here, before anything else looks at the path.
    """
    path = path.strip()
    if ATTRIBUTE_CHAIN_RE.match(path):
        module, _, chain = path.partition(":")
        raise ValueError(
            f"{path!r} walks an attribute chain ({chain}); a registry path names one function defined in the "
            f"module itself, as '{module}:<function>'. To use {chain.rsplit('.', 1)[-1]!r} from elsewhere, write a "
            f"tool or reward in {module} that calls it, and register that function."
        )
    if not IMPORT_PATH_RE.match(path):
        raise ValueError(
            f"{path!r} is not an import path; write it as 'package.module:function' "
            "(dotted module, a colon, then the name of a function defined in that module)"
        )
    return path


@dataclass(frozen=True)
class Source:
    """What the rule found at an import path: a trusted package's object, or a plugin folder's module (from
    either, only objects decorated with ``@agentfly.tool`` / ``@agentfly.reward`` are taken).

    Attributes:
        origin: "package" (AgentFly's built-ins or ``AGENTFLY_TOOL_PACKAGES``) or "plugin" (a module inside
            ``AGENTFLY_PLUGIN_DIRS``).
        module_file: the module's file as located on disk (resolved); a worker refuses a module that
            imports from anywhere else.
    """

    origin: str
    module_file: str


def team_package(slug: str) -> str:
    """The import package of a team's plugin folder: ``team-a`` -> ``agentfly_teams.team_a``."""
    return f"{TEAM_PACKAGE}.{slug.replace('-', '_')}"


def is_shared_package(folder: Path) -> bool:
    """A folder of a plugin dir with an ``__init__.py`` is a shared package (``text_utils/``), importable by
    every team. It is never a team's folder, even when a team is named like it: a team created as
    ``text_utils`` must not take the shared package over (its folder is refused until one is renamed)."""
    return (folder / "__init__.py").is_file()


def team_folders(ident: str, plugin_dirs: Iterable[Path | str]) -> list[Path]:
    """Every ``<dir>/<slug>/`` whose package name is ``agentfly_teams.<ident>`` (more than one is ambiguous).
    A shared package (``is_shared_package``) is never one."""
    found = []
    for folder in plugin_dirs:
        root = Path(folder)
        if not root.is_dir():
            continue
        for child in sorted(root.iterdir()):
            if child.is_dir() and child.name.replace("-", "_") == ident and not is_shared_package(child):
                found.append(child)
    return found


def shared_package_names(plugin_dirs: Iterable[Path | str]) -> set[str]:
    """The names of the shared plugin packages and modules (``text_utils/``, ``word_tools.py``) of the plugin
    folders: no team may take one as its slug (the account rules ask this)."""
    names: set[str] = set()
    for folder in plugin_dirs:
        root = Path(folder)
        if root.is_dir():
            names.update(c.name for c in root.iterdir() if is_shared_package(c))
            names.update(c.stem for c in root.glob("*.py"))
    return names


def visible_plugin_paths(plugin_dirs: Iterable[Path | str], team_slug: str | None,
                         team_slugs: Iterable[str]) -> list[str]:
    """What a "try it" child of team ``team_slug`` (None: a built-in entry) may read of the plugin folders:
    the shared modules and packages, and that team's own folder. Every other team's folder (a folder named
    like one of ``team_slugs``) is left out of its root, so it does not exist there; so are hidden entries."""
    teams = {slug.replace("-", "_") for slug in team_slugs}
    visible: list[str] = []
    for folder in plugin_dirs:
        root = Path(folder)
        if not root.is_dir():
            continue
        for child in sorted(root.iterdir()):
            if child.name.startswith("."):
                continue
            claimed = child.is_dir() and not is_shared_package(child) and child.name.replace("-", "_") in teams
            if claimed and child.name != team_slug:
                continue  # another team's folder
            visible.append(str(child))
    return visible


def module_files(locations: Sequence[Path], parts: Sequence[str]) -> list[Path] | None:
    """The files Python would execute to import ``parts`` below ``locations`` (each package's
    ``__init__.py``, then the module), found the way the path finder does, or None when it is not there."""
    files: list[Path] = []
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        found: list[Path] | None = None
        namespace: list[Path] = []
        for location in locations:
            package, module = location / part, location / f"{part}.py"
            if (package / "__init__.py").is_file():
                files.append(package / "__init__.py")
                found = [package]
                break
            if module.is_file():
                if not last:
                    return None  # a plain module has no submodules
                files.append(module)
                return files
            if package.is_dir():
                namespace.append(package)
        if found is None:
            if not namespace or last:
                return None  # a namespace package alone is no module of code to register
            found = namespace
        locations = found
    return files or None


def resolved_inside(files: Iterable[Path], root: Path) -> Path | None:
    """The first of ``files`` whose real path (symlinks and ``..`` resolved) is outside ``root``."""
    real_root = root.resolve()
    for file in files:
        if not file.resolve().is_relative_to(real_root):
            return file
    return None


class _PackageLoader(importlib.abc.Loader):
    """The loader of ``agentfly_teams`` and of each team's package: they have no code of their own."""

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        pass


class TeamFinder(importlib.abc.MetaPathFinder):
    """Finds ``agentfly_teams`` and ``agentfly_teams.<team>``; their modules are then found below the team
    folder by Python's own path finder (the team package's ``__path__`` is the folder)."""

    def __init__(self, plugin_dirs: Sequence[Path]) -> None:
        self.plugin_dirs = list(plugin_dirs)

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        parts = fullname.split(".")
        if parts[0] != TEAM_PACKAGE or len(parts) > 2:
            return None
        spec = importlib.machinery.ModuleSpec(fullname, _PackageLoader(), is_package=True)
        if len(parts) == 1:
            spec.submodule_search_locations = []
            return spec
        folders = team_folders(parts[1], self.plugin_dirs)
        if len(folders) != 1:
            return None  # missing, or two folders (team-a/ and team_a/) claim one package: import nothing
        spec.submodule_search_locations = [str(folders[0].resolve())]
        return spec


def install_team_finder(plugin_dirs: Sequence[Path]) -> None:
    """Put one ``TeamFinder`` for ``plugin_dirs`` on ``sys.meta_path`` (replacing an older one)."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, TeamFinder)]
    sys.meta_path.append(TeamFinder(plugin_dirs))


def found_elsewhere(top: str, plugin_dirs: Sequence[Path]) -> str | None:
    """Where Python would import the top-level module ``top`` from if not from a plugin folder (the standard
    library, an installed package), or None. Looks, never imports: a top-level ``find_spec`` runs no code."""
    if top in sys.builtin_module_names or top in sys.stdlib_module_names:
        return "the standard library"
    roots = [Path(d).resolve() for d in plugin_dirs]

    def in_plugins(path: str | None) -> bool:
        return bool(path) and any(Path(path).resolve().is_relative_to(r) for r in roots)  # type: ignore[arg-type]

    loaded = sys.modules.get(top)
    if loaded is not None:
        origin = getattr(loaded, "__file__", None)
        return None if in_plugins(origin) else (origin or "an installed module")
    for finder in sys.meta_path:
        if finder is importlib.machinery.PathFinder or isinstance(finder, TeamFinder):
            continue
        try:
            spec = finder.find_spec(top, None)
        except Exception:
            continue
        if spec is not None:
            return spec.origin or "an installed package"
    paths = [p for p in sys.path if not in_plugins(p or ".")]
    spec = importlib.machinery.PathFinder.find_spec(top, paths)
    if spec is not None:
        return spec.origin or ", ".join(spec.submodule_search_locations or []) or "an installed package"
    return None
