"""The resource specs the web app knows, by the name a tool declares (``@tool(resource="python")``).

A "try it" call, and a job's pools, need a ``ResourceSpec`` for every resource their tools declare. The
built-in tools' resources are listed here; each spec is imported on first use, on the worker, because
building one can load an index or start a JVM. A job's ``resources`` setting overrides pool sizes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any


def _python() -> Any:
    from agentfly.resources import Pool, PythonSandbox, ResourceSpec

    return ResourceSpec(name="python", factory=PythonSandbox, kind="sandbox", pool=Pool(min=0, max=4),
                        acquire_timeout=30)


def _wiki() -> Any:
    from agentfly.retrieval.index import WIKI_MINI

    return WIKI_MINI


def _scienceworld() -> Any:
    from agentfly.envs.scienceworld import SCIENCEWORLD

    return SCIENCEWORLD


KNOWN: dict[str, Callable[[], Any]] = {"python": _python, "wiki": _wiki, "scienceworld": _scienceworld}


class UnknownSandbox(LookupError):
    pass


def specs_for(names: Iterable[str], pools: Mapping[str, Mapping[str, int]] | None = None) -> list[Any]:
    """The specs of the named resources, with pool sizes from ``pools`` (``{"python": {"max": 2}}``)."""
    from agentfly.resources import Pool

    specs = []
    for name in sorted(set(names)):
        if name not in KNOWN:
            raise UnknownSandbox(f"a tool declares resource {name!r}, which this web app cannot provide; known "
                                 f"resources: {', '.join(sorted(KNOWN))}")
        spec = KNOWN[name]()
        size = (pools or {}).get(name)
        if size:
            spec = replace(spec, pool=Pool(min=int(size.get("min", spec.pool.min)),
                                           max=int(size.get("max", spec.pool.max))))
        specs.append(spec)
    return specs
