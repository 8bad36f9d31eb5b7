"""The resource specs the web app can provide, by the name a tool declares (``@tool(resource="python")``).

A "try it" call, and a job's pools, need a ``ResourceSpec`` for every resource their tools declare. They are
the library's built-ins (``agentfly.resources.builtin``), imported on first use, on the worker, because
building one can load an index or start a JVM. A job's ``resources`` setting overrides pool sizes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentfly.resources import ResourceSpec


class UnknownSandbox(LookupError):
    pass


def specs_for(names: Iterable[str], pools: Mapping[str, Mapping[str, int]] | None = None) -> list[ResourceSpec]:
    """The specs of the named resources, with pool sizes from ``pools`` (``{"python": {"max": 2}}``)."""
    from agentfly.resources import UnknownResource
    from agentfly.resources.builtin import BUILTIN_SPECS, builtin_spec, with_pool

    specs = []
    for name in sorted(set(names)):
        try:
            spec = builtin_spec(name)
        except UnknownResource:
            raise UnknownSandbox(f"a tool declares resource {name!r}, which this web app cannot provide; known "
                                 f"resources: {', '.join(sorted(BUILTIN_SPECS))}") from None
        size = (pools or {}).get(name) or {}
        low, high = size.get("min"), size.get("max")
        specs.append(with_pool(spec, pool_min=None if low is None else int(low),
                               pool_max=None if high is None else int(high)))
    return specs
