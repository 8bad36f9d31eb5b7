"""The context layer: ``RolloutContext`` carries one rollout's task sample, ids, injected information and
the resources it holds.

Tools and rewards receive it by declaring a ``context`` parameter. ``await context.resource(name)``
acquires the named resource from the job's ``ResourceEngine`` on first use and returns the same instance on
every later turn of this rollout; ``aclose()`` (run by the rollout loop in ``finally``) releases them all.

A rollout may also *own* an instance that no pool lent it: a fork of a group's prepared workspace, or of its
parent's instance when a rollout is branched (``adopt``). It is used like a leased one and closed, not
released, when the rollout ends; ``fork_held(n)`` forks everything the rollout holds for ``n`` branches.
"""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from agentfly.resources.pool import Lease


class ResourceProvider(Protocol):
    """What the context needs from a resource engine (``agentfly.resources.ResourceEngine``)."""

    async def acquire(self, name: str, *, owner: str | None = None, timeout: float | None = None) -> Lease:
        """Return a lease whose ``.instance`` is the resource."""

    async def release(self, lease: Lease, *, healthy: bool = True) -> None: ...


class NoResourceEngine(RuntimeError):
    pass


class _Held:
    """What ``RolloutContext.resource`` returns: awaitable, and an async context manager."""

    __slots__ = ("ctx", "name", "timeout")

    def __init__(self, ctx: RolloutContext, name: str, timeout: float | None) -> None:
        self.ctx, self.name, self.timeout = ctx, name, timeout

    def __await__(self) -> Generator[Any, None, Any]:
        return self.ctx._acquire(self.name, self.timeout).__await__()

    async def __aenter__(self) -> Any:
        return await self.ctx._acquire(self.name, self.timeout)

    async def __aexit__(self, *exc: object) -> None:
        return None  # held until the rollout ends: RolloutContext.aclose releases it


@dataclass
class RolloutContext:
    sample: dict[str, Any]
    rollout_id: str
    group_id: str
    resources: ResourceProvider | None = None
    info: dict[str, Any] = field(default_factory=dict)  # injected per-rollout information (e.g. a variation)
    _leases: dict[str, Lease] = field(default_factory=dict, repr=False)
    _locks: dict[str, asyncio.Lock] = field(default_factory=dict, repr=False)
    _unhealthy: set[str] = field(default_factory=set, repr=False)
    _owned: dict[str, Any] = field(default_factory=dict, repr=False)  # adopted instances (forks), closed at the end
    # The assistant turn whose tool calls are running (set by the rollout loop), and the rewards credited to
    # turns so far as (turn, value, reason).
    turn: int = 0
    turn_rewards: list[tuple[int, float, str]] = field(default_factory=list)
    # Set by a tool whose environment ended the episode (a game won or lost): the rollout stops after this
    # turn's observations instead of asking the model for another turn.
    ended: str | None = None

    def end_episode(self, reason: str) -> None:
        """End the rollout after the running turn's tool calls: the environment is over (won, lost, out of
        moves), so another turn would only be trained on noise. ``reason`` is kept on the trajectory."""
        self.ended = str(reason) or "ended"

    def reward_turn(self, value: float, reason: str = "") -> None:
        """Credit ``value`` to the turn whose tool call is running (e.g. a key found on one hop of a chain).

        Turn rewards are kept on the trajectory beside the outcome reward and shown per turn in the rollout
        viewer; the trainer's turn-level estimators (``algorithm.credit``) train on them, the outcome-only
        ones add them to the outcome.
        """
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value != value:
            raise TypeError(f"reward_turn(value={value!r}): give a finite number, e.g. context.reward_turn(0.1)")
        self.turn_rewards.append((self.turn, float(value), str(reason)))

    def resource(self, name: str, timeout: float | None = None) -> _Held:
        """The instance of resource ``name`` this rollout holds, acquiring it on first use.

        Use as ``box = await ctx.resource("python")`` or ``async with ctx.resource("python") as box:``; both
        keep the instance for the rest of the rollout (leaving the ``async with`` block does not release it,
        the end of the rollout does), so later turns see the same state.
        """
        return _Held(self, name, timeout)

    async def _acquire(self, name: str, timeout: float | None) -> Any:
        if name in self._owned:
            return self._owned[name]
        if name in self._leases:
            return self._leases[name].instance
        if self.resources is None:
            raise NoResourceEngine(
                f"resource {name!r} was requested but this rollout has no ResourceEngine; "
                "pass resources=ResourceEngine([...]) to the Agent"
            )
        # Two tool calls of one turn may ask at once: only one acquires, the other waits for it.
        lock = self._locks.setdefault(name, asyncio.Lock())
        async with lock:
            if name not in self._leases:
                self._leases[name] = await self.resources.acquire(name, owner=self.rollout_id, timeout=timeout)
        return self._leases[name].instance

    def holds(self, name: str) -> bool:
        return name in self._leases or name in self._owned

    def adopt(self, name: str, instance: Any) -> None:
        """Hold ``instance`` as this rollout's ``name`` (a fork); it is closed when the rollout ends."""
        if self.holds(name):
            raise RuntimeError(f"this rollout already holds a {name!r}; adopt an instance before its first use")
        self._owned[name] = instance

    async def fork_held(self, n: int) -> list[dict[str, Any]]:
        """``n`` sets of copies of every instance this rollout holds, for ``n`` branches of it. Refused (before
        anything is forked) when one cannot fork: a branch would silently start from a fresh instance."""
        held = {**{name: lease.instance for name, lease in self._leases.items()}, **self._owned}
        stuck = [name for name, instance in held.items() if not callable(getattr(instance, "fork", None))]
        if stuck:
            raise TypeError(f"cannot branch this rollout: its {', '.join(sorted(stuck))} cannot be forked (only "
                            "resources with fork(n), such as the workspace, can); branch before its first use")
        copies: list[dict[str, Any]] = [{} for _ in range(n)]
        made: list[Any] = []
        try:
            for name, instance in held.items():
                for branch, copy in zip(copies, await instance.fork(n), strict=True):
                    branch[name] = copy
                    made.append(copy)
        except BaseException:
            for copy in made:
                await copy.close()
            raise
        return copies

    def mark_unhealthy(self, name: str) -> None:
        """Ask for the instance to be destroyed, not reset, when the rollout releases it."""
        self._unhealthy.add(name)

    async def aclose(self) -> None:
        """Release every resource this rollout holds, even if some releases fail."""
        leases, self._leases = self._leases, {}
        owned, self._owned = self._owned, {}
        errors = []
        for name, instance in owned.items():
            try:
                await instance.close()
            except Exception as exc:
                errors.append(f"{name}: {exc}")
        for name, lease in leases.items():
            try:
                assert self.resources is not None
                await self.resources.release(lease, healthy=name not in self._unhealthy)
            except Exception as exc:  # keep releasing the others
                errors.append(f"{name}: {exc}")
        if errors:
            raise RuntimeError("releasing resources failed: " + "; ".join(errors))


__all__ = ["NoResourceEngine", "ResourceProvider", "RolloutContext"]
