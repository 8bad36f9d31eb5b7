"""The built-in resource specs, by the name a tool declares (``@tool(resource="python")``), and the one
way to resize a spec's pool.

Each spec is declared next to what uses it (``PYTHON_SANDBOX`` by ``python_code``, ``KEY_CHAIN`` with its store,
``WIKI_MINI`` by the retrieval index, ``SCIENCEWORLD`` by the environment) and registers itself there:
``PYTHON_SANDBOX = register_builtin(ResourceSpec(...))``. Declaring builds nothing (building one can load an
index or start a JVM; that happens when a pool starts an instance). ``import agentfly`` imports the declaring
modules, so every built-in is here before anyone looks one up, and this layer names none of the layers above
it. The trainer (``resources:`` in its config) and the web app (a job's pools, a "try it" call) both look
built-ins up here.
"""

from __future__ import annotations

import dataclasses

from agentfly.resources.spec import Pool, ResourceSpec, UnknownResource

BUILTIN_SPECS: dict[str, ResourceSpec] = {}  # by name, in the order their modules registered them


def register_builtin(spec: ResourceSpec) -> ResourceSpec:
    """Make ``spec`` a built-in under its name (and return it, for the declaring assignment); a second,
    different spec of a taken name is refused."""
    known = BUILTIN_SPECS.get(spec.name)
    if known is not None and known is not spec:
        raise ValueError(f"a built-in resource named {spec.name!r} is already registered ({known.factory!r}); "
                         "give this one another name")
    BUILTIN_SPECS[spec.name] = spec
    return spec


def builtin_spec(name: str) -> ResourceSpec:
    """The built-in spec named ``name``; ``UnknownResource`` names the built-ins when there is none."""
    spec = BUILTIN_SPECS.get(name)
    if spec is None:
        raise UnknownResource(f"resource {name!r} is not built in; built-in resources: {', '.join(sorted(BUILTIN_SPECS))}")
    return spec


def with_pool(spec: ResourceSpec, *, name: str | None = None, pool_min: int | None = None,
              pool_max: int | None = None, acquire_timeout: float | None = None,
              pool_starting: int | None = None) -> ResourceSpec:
    """``spec`` renamed, resized (``Pool``'s min, max, starting) and with another acquire timeout where those
    are given (None keeps the spec's own). A ``pool_max`` below the spec's ``min`` lowers ``min`` to it, so a
    max alone always fits."""
    changes: dict[str, object] = {}
    if name is not None:
        changes["name"] = name
    if pool_min is not None or pool_max is not None or pool_starting is not None:
        high = pool_max if pool_max is not None else spec.pool.max
        changes["pool"] = Pool(min=pool_min if pool_min is not None else min(spec.pool.min, high), max=high,
                               starting=pool_starting if pool_starting is not None else spec.pool.starting)
    if acquire_timeout is not None:
        changes["acquire_timeout"] = acquire_timeout
    return dataclasses.replace(spec, **changes)  # type: ignore[arg-type]
