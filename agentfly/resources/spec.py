"""What a resource is (``Resource``), how a job declares one (``ResourceSpec``, ``Pool``) and the errors.

A resource is anything a rollout holds while it runs: a sandbox, an environment, a model service, a
rate-limited API client. The engine only needs five things from it, the ``Resource`` protocol below;
everything else (``run``, ``act``, ``search``) is the resource's own API, used by tools.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

# The failure types live one floor down, where the engines (which raise them too) reach them without this
# layer; they are this module's names as well, as every caller has always imported them.
from agentfly.failures import FAILURE_KINDS as FAILURE_KINDS
from agentfly.failures import InfrastructureFailure as InfrastructureFailure
from agentfly.failures import ResourceError as ResourceError
from agentfly.failures import ResourceTimeout as ResourceTimeout

Scope = Literal["rollout", "global"]
Kind = Literal["sandbox", "environment", "model_service", "api", "index", "mcp", "other"]
SCOPES: tuple[str, ...] = ("rollout", "global")
KINDS: tuple[str, ...] = ("sandbox", "environment", "model_service", "api", "index", "mcp", "other")
BACKENDS: tuple[str, ...] = ("local", "docker", "inprocess", "ray")


class ResourceClosed(ResourceError):
    """The engine was closed; no more instances are handed out."""


class UnknownResource(ResourceError, KeyError):
    """A name that no ``ResourceSpec`` of this engine declares."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


@runtime_checkable
class Resource(Protocol):
    """What the engine calls on an instance. All methods are async except ``kill``.

    - ``start()``: bring it up (spawn the process, load the index). Called once, before first use.
    - ``reset()``: return it to a clean state between rollouts; raise if that is not possible, and the
      engine destroys the instance instead.
    - ``health()``: a cheap liveness probe; False (or an exception) gets the instance replaced.
    - ``close()``: stop it and free everything it holds; idempotent.
    - ``kill()``: the synchronous last resort used at interpreter exit and on SIGTERM.
    """

    async def start(self) -> None: ...
    async def reset(self) -> None: ...
    async def health(self) -> bool: ...
    async def close(self) -> None: ...
    def kill(self) -> None: ...


@dataclass(frozen=True)
class Pool:
    """How many instances of a resource may exist.

    Attributes:
        min: instances created when the engine starts, and kept alive (pre-warmed) afterwards.
        max: the hard bound; acquirers beyond it wait in a first-in first-out queue.
        starting: at most this many instances start at once (the others wait their turn, within the
            acquirer's timeout), so that each start, e.g. a server process importing its SDK, gets the CPU
            instead of timing out beside a hundred others; None: no bound.
    """

    min: int = 0
    max: int = 8
    starting: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.min, int) or not isinstance(self.max, int):
            raise TypeError(f"Pool(min={self.min!r}, max={self.max!r}): min and max must be integers")
        if self.starting is not None and (not isinstance(self.starting, int) or self.starting < 1):
            raise ValueError(f"Pool(starting={self.starting!r}): start at least 1 instance at a time, or None")
        if self.max < 1:
            raise ValueError(f"Pool(max={self.max}): max must be at least 1")
        if not 0 <= self.min <= self.max:
            raise ValueError(f"Pool(min={self.min}, max={self.max}): need 0 <= min <= max")


@dataclass(frozen=True)
class ResourceSpec:
    """A resource a job uses, by name.

    Attributes:
        name: what tools ask for (``@tool(resource=name)``, ``await context.resource(name)``).
        factory: builds one instance; called as ``factory(spec)`` if it takes an argument, else ``factory()``.
            A class such as ``PythonSandbox`` works as is.
        kind: what it is (sandbox, environment, model_service, api, index, other); shown in stats and the
            dashboard. Defaults to the factory's ``kind`` attribute (PythonSandbox: "sandbox"), else "other".
        backend: where instances run: ``local`` child processes (the default), ``docker`` containers,
            ``inprocess`` objects, or ``ray`` actors on a Ray cluster (one pool for the whole job; see
            ``agentfly.resources.backends.ray``). Resources that do not run code ignore the first three.
        pool: ``Pool(min, max)``; with scope "global" there is exactly one shared instance.
        scope: "rollout" (acquired on a rollout's first use, the same instance for its later turns, released
            when it ends) or "global" (one instance shared by every rollout, e.g. an index or a judge model).
        acquire_timeout: seconds an acquirer waits for a free instance before ``ResourceTimeout``; None waits
            forever (not recommended: a stuck pool then hangs the job).
        health_check: probe idle instances before handing them out and every ``health_interval`` seconds.
        health_interval: seconds between background probes of idle instances (0 turns them off).
        reset: reset instances on release (False keeps state across rollouts: only for stateless resources).
        options: keyword arguments for the resource (limits, paths); the factory reads ``spec.options``.
    """

    name: str
    factory: Callable[..., Any]
    kind: str | None = None
    backend: str = "local"
    pool: Pool = field(default_factory=Pool)
    scope: str = "rollout"
    acquire_timeout: float | None = 60.0
    health_check: bool = True
    health_interval: float = 30.0
    reset: bool = True
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not re.fullmatch(r"[A-Za-z_][\w.-]*", self.name):
            raise ValueError(f"ResourceSpec(name={self.name!r}): use letters, digits, '_', '-', '.'")
        if not callable(self.factory):
            raise TypeError(
                f"ResourceSpec {self.name!r}: factory must be callable (a class like PythonSandbox or a function "
                f"returning an instance), got {self.factory!r}"
            )
        if self.kind is None:
            object.__setattr__(self, "kind", getattr(self.factory, "kind", "other"))
        if self.scope not in SCOPES:
            raise ValueError(f"ResourceSpec {self.name!r}: scope={self.scope!r}; use one of {SCOPES}")
        if self.kind not in KINDS:
            raise ValueError(f"ResourceSpec {self.name!r}: kind={self.kind!r}; use one of {KINDS}")
        if self.backend not in BACKENDS:
            raise ValueError(f"ResourceSpec {self.name!r}: backend={self.backend!r}; use one of {BACKENDS}")
        if not isinstance(self.pool, Pool):
            raise TypeError(f"ResourceSpec {self.name!r}: pool must be af.Pool(min=..., max=...), got {self.pool!r}")
        if self.acquire_timeout is not None and self.acquire_timeout <= 0:
            raise ValueError(f"ResourceSpec {self.name!r}: acquire_timeout must be positive seconds or None")
        if self.health_interval < 0:
            raise ValueError(f"ResourceSpec {self.name!r}: health_interval must be >= 0 (0 turns it off)")

    def build(self) -> Resource:
        """A new, not yet started instance."""
        try:
            params = inspect.signature(self.factory).parameters.values()
            takes_spec = any(
                p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in params
            )
        except (TypeError, ValueError):  # builtins without a signature
            takes_spec = False
        instance: Resource = self.factory(self) if takes_spec else self.factory()
        missing = [m for m in ("start", "reset", "health", "close") if not callable(getattr(instance, m, None))]
        if missing:
            raise TypeError(
                f"resource {self.name!r}: {type(instance).__name__} lacks {', '.join(missing)}; a resource needs "
                "async start(), reset(), health(), close() (see agentfly.resources.Resource)"
            )
        return instance

    def replace(self, **changes: Any) -> ResourceSpec:
        """A copy with some fields changed, e.g. ``af.envs.SCIENCEWORLD.replace(pool=af.Pool(2, 4))``."""
        from dataclasses import replace

        return replace(self, **changes)
