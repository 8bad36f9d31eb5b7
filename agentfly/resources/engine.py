"""``ResourceEngine``: the pools of one job, behind ``acquire``/``release``/``stats``.

    engine = ResourceEngine([PY, af.envs.SCIENCEWORLD, af.retrieval.WIKI_MINI])
    async with engine:                       # start() pre-warms each pool's min; aclose() stops everything
        lease = await engine.acquire("python", owner="rollout-7", timeout=30)
        await lease.instance.run("x = 1")
        await engine.release(lease)          # reset in the background, then handed to the next waiter

Rollouts do not call this directly: ``RolloutContext.resource(name)`` acquires on first use and
``RolloutContext.aclose()`` releases in the rollout loop's ``finally``.

Leaks are guarded at three levels: the rollout's ``finally`` (success, error, timeout, cancellation),
``aclose()`` (closes instances still leased when the job ends), and a process-wide hook at interpreter exit
and on SIGTERM that kills the processes of every engine not yet closed.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterable, Mapping
from types import FrameType
from typing import TYPE_CHECKING, Any

from agentfly.resources.backends.local import kill_all_workers, sweep_sandboxes
from agentfly.resources.pool import GlobalPool, Lease, RolloutPool
from agentfly.resources.spec import ResourceClosed, ResourceSpec, UnknownResource

if TYPE_CHECKING:
    from agentfly.resources.backends.ray import RayPool, RaySettings

# Strong references: an engine dropped without aclose() still owns processes, and must be found at exit.
_live_engines: set[ResourceEngine] = set()
_hooks_installed = False
_previous_sigterm: Callable[[int, FrameType | None], object] | int | None = None  # signal.getsignal's


class ResourceEngine:
    """The resource pools of one job. Safe to share between all rollouts of that job (one event loop).

    Specs with ``backend="ray"`` get a ``RayPool``: the job's one pool on the Ray cluster that ``ray``
    (default: ``RaySettings.from_env()``) names, shared with every other process of the same job id.
    """

    def __init__(self, specs: Iterable[ResourceSpec] = (), *, ray: RaySettings | None = None) -> None:
        self.specs: dict[str, ResourceSpec] = {}
        self.pools: dict[str, RolloutPool | GlobalPool | RayPool] = {}
        self.ray_settings = ray
        for spec in specs:
            self.add(spec)
        self.closed = False
        self._loop: asyncio.AbstractEventLoop | None = None

    def add(self, spec: ResourceSpec) -> None:
        """Declare one more resource (before or after ``start``)."""
        if not isinstance(spec, ResourceSpec):
            raise TypeError(f"ResourceEngine takes ResourceSpec objects, got {type(spec).__name__}: {spec!r}")
        if spec.name in self.specs:
            raise ValueError(f"two resources are named {spec.name!r}; give each ResourceSpec a distinct name")
        self.specs[spec.name] = spec
        self.pools[spec.name] = self._new_pool(spec)

    def _new_pool(self, spec: ResourceSpec) -> RolloutPool | GlobalPool | RayPool:
        if spec.backend == "ray":
            from agentfly.resources.backends.ray import RayPool, RaySettings

            if self.ray_settings is None:
                self.ray_settings = RaySettings.from_env()
            if self.ray_settings.job is None:  # one private job for this engine's pools, not one per pool
                import dataclasses
                import uuid

                self.ray_settings = dataclasses.replace(self.ray_settings, job=f"private-{uuid.uuid4().hex[:12]}")
            return RayPool(spec, self.ray_settings)
        return RolloutPool(spec) if spec.scope == "rollout" else GlobalPool(spec)

    def __contains__(self, name: str) -> bool:
        return name in self.pools

    def _pool(self, name: str) -> RolloutPool | GlobalPool | RayPool:
        try:
            return self.pools[name]
        except KeyError:
            raise UnknownResource(
                f"no resource named {name!r}; this engine has {sorted(self.pools)}. Add a ResourceSpec(name="
                f"{name!r}, ...) to the ResourceEngine, or fix the tool's resource= name"
            ) from None

    def _bind_loop(self) -> None:
        """Instances belong to the event loop that made them (their pipes, locks and tasks do). When a new
        loop takes over because the old one ended (``agent.run_sync`` twice), start over with fresh pools."""
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return
        if self._loop is not None and not self._loop.is_closed() and self._loop.is_running():
            raise RuntimeError(
                "this ResourceEngine is in use by another running event loop; use one engine per loop/thread"
            )
        if self._loop is not None:
            for pool in self.pools.values():
                pool.kill_all()
            self.pools = {name: self._new_pool(spec) for name, spec in self.specs.items()}
        self._loop = loop
        _live_engines.add(self)
        _install_exit_hooks()

    async def start(self) -> None:
        """Pre-warm every pool's ``min`` instances, concurrently. Raises if one cannot start."""
        if self.closed:
            raise ResourceClosed("this ResourceEngine was closed; create a new one")
        self._bind_loop()
        # Folders and processes of sandboxes whose owner was SIGKILLed (one listing when there are none).
        with contextlib.suppress(Exception):
            sweep_sandboxes()
        await asyncio.gather(*(pool.start() for pool in self.pools.values()))

    async def acquire(self, name: str, *, owner: str | None = None, timeout: float | None = None) -> Lease:
        """An instance of resource ``name``; waits (FIFO) up to ``timeout`` (default: the spec's) when full."""
        self._pool(name)
        if self.closed:
            raise ResourceClosed(f"this ResourceEngine was closed; cannot acquire {name!r}")
        self._bind_loop()
        pool = self._pool(name)
        return await pool.acquire(owner, pool.spec.acquire_timeout if timeout is None else timeout)

    def rollout_pools(self) -> dict[str, int]:
        """Each rollout-scoped pool's ``max``, by name: how many rollouts (or groups, whose rollouts share a
        forked instance) can hold one of its instances at once. The rollout layer admits no more than that
        (``RolloutRunner.run``); more would wait in the pool's queue, where a long episode makes them time out."""
        return {name: spec.pool.max for name, spec in self.specs.items() if spec.scope == "rollout"}

    def group_forks(self, name: str) -> bool:
        """Whether the rollouts of one group share one prepared instance of ``name``, each holding a fork of it
        (the spec's ``options["group_forks"]``, else its factory's ``group_forks``: the workspace's is True).
        Not on Ray: an actor's files are on its node, where the rollout's forks could not reach them."""
        spec = self.specs.get(name)
        if spec is None or spec.backend == "ray" or spec.scope != "rollout":
            return False
        return bool(spec.options.get("group_forks", getattr(spec.factory, "group_forks", False)))

    async def fork_group(self, name: str, n: int, *, sample: Mapping[str, Any] | None = None,
                         owner: str | None = None) -> tuple[Lease, list[Any]]:
        """Prepare one instance of ``name`` for ``sample`` (its ``prepare_sample``) and fork it ``n`` times: a
        GRPO group's setup runs once, not once per rollout. Returns the lease of the prepared instance (release
        it when the group is done) and the forks (each closed by the rollout that holds it). The forks are not
        counted in the pool: they hold files, and no process between their calls."""
        lease = await self.acquire(name, owner=owner)
        try:
            instance = lease.instance
            prepare = getattr(instance, "prepare_sample", None)
            if sample is not None and callable(prepare):
                await prepare(sample)
            return lease, list(await instance.fork(n))
        except BaseException:
            await self.release(lease, healthy=False)
            raise

    async def release(self, lease: Lease, *, healthy: bool = True) -> None:
        """Give ``lease`` back. Never blocks on the reset (it runs in the background); releasing twice is a no-op."""
        pool = self._pool(lease.pool)
        if self.closed or lease.slot not in pool.instances:
            # Closed, or the lease outlived its pool (the loop changed): nothing to give back to.
            lease.released = True
            return
        pool.release(lease, healthy)

    async def settle(self, timeout: float = 60.0) -> None:
        """Wait until background resets, destructions and refills are done (tests, benchmarks, shutdown)."""
        async def drained() -> None:
            while True:
                pending = [t for pool in self.pools.values() for t in pool.tasks if not _is_monitor(t)]
                if not pending:
                    return
                await asyncio.wait(pending)

        await asyncio.wait_for(drained(), timeout)

    def stats(self) -> dict[str, dict[str, object]]:
        """Per pool: size, in_use, idle, waiting, created, destroyed, failed, acquire p50/p99 ms, isolation."""
        return {name: pool.stats() for name, pool in self.pools.items()}

    async def aclose(self) -> None:
        """Close every pool: waiters get ``ResourceClosed``, every instance (idle or leased) is stopped."""
        if self.closed:
            return
        self.closed = True
        await asyncio.gather(*(pool.aclose() for pool in self.pools.values()), return_exceptions=True)
        _live_engines.discard(self)

    def close(self) -> None:
        """Synchronous stop: ``aclose()`` when no event loop runs here (on the loop the instances belong to
        when it is idle, as ``Agent.run_sync``'s is between calls), else a hard kill of every instance."""
        if self.closed:
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            loop = self._loop
            with contextlib.suppress(Exception):
                if loop is not None and not loop.is_closed() and not loop.is_running():
                    loop.run_until_complete(self.aclose())
                else:
                    asyncio.run(self.aclose())
        self.kill()

    def kill(self) -> None:
        """Kill every instance's processes at once (interpreter exit, SIGTERM). Does not await anything."""
        self.closed = True
        for pool in self.pools.values():
            pool.kill_all()
        _live_engines.discard(self)

    async def __aenter__(self) -> ResourceEngine:
        try:
            await self.start()
        except BaseException:
            await self.aclose()  # __aexit__ will not run: stop what did start
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"ResourceEngine({list(self.specs)}, closed={self.closed})"


def _is_monitor(task: asyncio.Task[object]) -> bool:
    coro = task.get_coro()
    return getattr(coro, "__name__", "") == "_monitor"


def _kill_live_engines() -> None:
    for engine in list(_live_engines):
        with contextlib.suppress(Exception):
            engine.kill()
    kill_all_workers()  # and sandboxes started without an engine


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    _kill_live_engines()
    previous = _previous_sigterm
    if callable(previous):
        previous(signum, frame)
    elif previous != signal.SIG_IGN:
        # Default action: die by SIGTERM, as if we had never caught it.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


def _install_exit_hooks() -> None:
    """Once per process: kill leftover instances at interpreter exit and on SIGTERM."""
    global _hooks_installed, _previous_sigterm
    if _hooks_installed:
        return
    _hooks_installed = True
    atexit.register(_kill_live_engines)
    if threading.current_thread() is threading.main_thread():
        with contextlib.suppress(ValueError, OSError):
            _previous_sigterm = signal.getsignal(signal.SIGTERM)
            signal.signal(signal.SIGTERM, _on_sigterm)
