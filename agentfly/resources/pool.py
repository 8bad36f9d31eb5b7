"""Pools: a bounded set of instances of one resource, handed out first-come first-served.

Invariants (the chaos test checks them after a thousand rollouts with random failures):
- ``size = idle + in_use + resetting + creating <= max`` at every moment; a slot is reserved *before* an
  instance is created, so concurrent acquirers can never overshoot ``max``.
- A released instance is handed straight to the oldest waiter (after its reset), so a waiter that arrived
  later can never overtake it (FIFO).
- ``release`` is synchronous bookkeeping plus a background reset task: it cannot be interrupted half-way
  by a cancellation, which is what makes "release runs on cancellation" hold.
- A waiter that is cancelled or times out after an instance was already handed to it gives the instance
  back, so nothing is lost in that race.

``PoolCore`` holds them once. A backend supplies where an instance lives and who pays for it (its hooks):
``RolloutPool`` keeps the resource object in this process and ``max`` is its only permit; the Ray backend's
job pool (``backends/ray.py``) keeps an actor on the cluster and takes a permit from the team's budget for
each. ``GlobalPool`` (one shared instance) has none of these invariants to keep.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import logging
import time
from collections import deque
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from agentfly.resources.spec import (
    InfrastructureFailure,
    Resource,
    ResourceClosed,
    ResourceError,
    ResourceSpec,
    ResourceTimeout,
)

log = logging.getLogger(__name__)
_ids = itertools.count(1)
LATENCY_WINDOW = 10_000
S = TypeVar("S")  # a backend's record of one instance (``Instance`` here, an actor's slot on Ray)


@dataclass(eq=False)
class Instance:
    """One live resource instance and its bookkeeping."""

    resource: Resource
    id: int = field(default_factory=lambda: next(_ids))
    created_at: float = field(default_factory=time.monotonic)
    uses: int = 0
    holders: int = 0  # global scope: how many leases share it
    retired: bool = False  # global scope: replaced; destroyed when its last holder releases


@dataclass(eq=False)
class Lease:
    """A rollout's hold on one instance; ``instance`` is the resource object itself."""

    pool: str
    owner: str | None
    slot: Instance
    acquired_at: float = field(default_factory=time.monotonic)
    released: bool = False

    @property
    def instance(self) -> Any:  # the resource's own API (``run``, ``act``...), which only its tools know
        return self.slot.resource


class Latencies:
    """Acquire wait times over the last ``LATENCY_WINDOW`` acquires."""

    def __init__(self) -> None:
        self.values: deque[float] = deque(maxlen=LATENCY_WINDOW)

    def add(self, seconds: float) -> None:
        self.values.append(seconds)

    def percentile(self, q: float) -> float | None:
        if not self.values:
            return None
        ordered = sorted(self.values)
        return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


class _Background:
    """Background tasks (resets, refills, the health monitor) that ``aclose`` cancels and waits for."""

    tasks: set[asyncio.Task[None]]

    def _spawn(self, coro: Coroutine[object, object, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task


class BasePool(_Background):
    """What both scopes share: creation, destruction, counters, stats, background tasks."""

    def __init__(self, spec: ResourceSpec) -> None:
        self.spec = spec
        self.closed = False
        self.created = self.destroyed = self.failed = self.timeouts = self.acquires = 0
        self.latency = Latencies()
        self.tasks: set[asyncio.Task[None]] = set()
        self.instances: set[Instance] = set()  # every live instance, whatever its state
        self.isolation: dict[str, object] | None = None
        self.last_error: str | None = None
        # Made on first use, on the pool's own event loop.
        self._starting: asyncio.Semaphore | contextlib.nullcontext[None] | None = None

    async def _create(self) -> Instance:
        """Build and start one instance; on failure clean up what started and raise ResourceError."""
        resource = None
        if self._starting is None:
            bound = self.spec.pool.starting
            self._starting = contextlib.nullcontext() if bound is None else asyncio.Semaphore(bound)
        try:
            async with self._starting:
                resource = self.spec.build()
                await resource.start()
        except asyncio.CancelledError:
            if resource is not None:
                await _quietly_close(resource)
            raise
        except Exception as exc:
            self.failed += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            if resource is not None:
                await _quietly_close(resource)
            raise InfrastructureFailure(f"could not start resource {self.spec.name!r}: {type(exc).__name__}: {exc}",
                                        "unhealthy") from exc
        self.created += 1
        slot = Instance(resource)
        self.instances.add(slot)
        if self.isolation is None:
            info = getattr(resource, "isolation", None)
            self.isolation = info() if callable(info) else info
        if self.closed:  # the engine closed while we were starting it
            await self._destroy(slot)
            raise ResourceClosed(f"resource engine closed while starting {self.spec.name!r}")
        return slot

    async def _destroy(self, slot: Instance) -> None:
        if slot not in self.instances:
            return
        self.instances.discard(slot)
        self.destroyed += 1
        await _quietly_close(slot.resource)

    async def _healthy(self, slot: Instance) -> bool:
        if not self.spec.health_check:
            return True
        try:
            return bool(await asyncio.wait_for(slot.resource.health(), 10))
        except asyncio.CancelledError:
            raise
        except Exception:
            return False

    def kill_all(self) -> None:
        """Synchronous last resort (interpreter exit, SIGTERM): kill every instance's processes."""
        self.closed = True
        for slot in list(self.instances):
            kill = getattr(slot.resource, "kill", None)
            if callable(kill):
                try:
                    kill()
                except Exception:
                    log.exception("killing %s instance %d failed", self.spec.name, slot.id)
        self.instances.clear()

    def base_stats(self) -> dict[str, object]:
        p50, p99 = self.latency.percentile(50), self.latency.percentile(99)
        stats: dict[str, object] = {
            "kind": self.spec.kind,
            "scope": self.spec.scope,
            "backend": self.spec.backend,
            "min": self.spec.pool.min,
            "max": self.spec.pool.max if self.spec.scope == "rollout" else 1,
            "created": self.created,
            "destroyed": self.destroyed,
            "failed": self.failed,
            "timeouts": self.timeouts,
            "acquires": self.acquires,
            "acquire_p50_ms": None if p50 is None else round(p50 * 1000, 3),
            "acquire_p99_ms": None if p99 is None else round(p99 * 1000, 3),
            "last_error": self.last_error,
        }
        if self.isolation is not None:
            stats["isolation"] = self.isolation
            if "network" in self.isolation:
                network = str(self.isolation["network"])
                stats["network_isolated"] = network.startswith("namespace") or network == "none (container)"
        return stats


class PoolCore(_Background, Generic[S]):
    """The invariants of a bounded pool (the module docstring), once, for every backend.

    A backend supplies where an instance lives and who pays for it, as five hooks on its slot type ``S``:
    ``_make`` (reserve whatever permit it needs, then build and start one; the in-process pool builds the
    resource here, the Ray pool takes a team permit and starts an actor), ``_unmake`` (stop it and give its
    permit back), ``_probe`` (is it alive), ``_clean`` (reset it for the next lease; raise if it cannot be)
    and ``_note_failed``. Whatever the backend, the pool's own permits are the ``max`` slots counted here.
    Subclasses set ``spec``, ``closed``, ``tasks`` and the counters ``failed``, ``timeouts``, ``last_error``.
    """

    spec: ResourceSpec
    closed: bool
    failed: int
    timeouts: int
    last_error: str | None

    def _init_core(self) -> None:
        self.idle: deque[S] = deque()
        self.waiters: deque[asyncio.Future[S | None]] = deque()
        self._in_use = 0
        self.peak_in_use = 0  # the most held at once since the previous stats() (see RolloutPool.stats)
        self.creating = 0
        self.resetting = 0

    # -- what a backend supplies ---------------------------------------------------------------------
    async def _make(self, deadline: float | None) -> S:
        """Build and start one instance in a slot already counted in ``creating``; raise ``ResourceError``."""
        raise NotImplementedError

    async def _unmake(self, slot: S) -> None:
        """Stop an instance and free what it held (never raises but for cancellation)."""
        raise NotImplementedError

    async def _probe(self, slot: S) -> bool:
        raise NotImplementedError

    async def _clean(self, slot: S) -> None:
        """Reset an instance for its next lease; raise when it cannot be trusted any more."""
        raise NotImplementedError

    def _wants_probe(self, slot: S) -> bool:
        """Whether an idle instance is probed before it is handed out."""
        return self.spec.health_check

    def _note_failed(self, slot: S | None, why: str) -> None:
        self.failed += 1
        self.last_error = why

    def _timeout_message(self, timeout: float | None) -> str:
        return (f"no {self.spec.name!r} instance became free within {timeout:g} s: the pool is at its max "
                f"of {self.spec.pool.max} ({self.in_use} in use, {len(self.waiters)} waiting). Raise "
                "Pool(max=...), raise acquire_timeout, or run fewer rollouts at once.")

    # -- the invariants ------------------------------------------------------------------------------
    @property
    def in_use(self) -> int:
        return self._in_use

    @in_use.setter
    def in_use(self, value: int) -> None:
        self._in_use = value
        self.peak_in_use = max(self.peak_in_use, value)

    @property
    def size(self) -> int:
        return len(self.idle) + self.in_use + self.resetting + self.creating

    async def _obtain(self, timeout: float | None) -> S:
        """An instance for one lease (counted in ``in_use``): idle, new, or handed over by a release."""
        deadline = None if timeout is None else time.monotonic() + timeout
        slot: S | None
        if not self.waiters and self.idle:
            slot = self.idle.popleft()
            self.in_use += 1
        elif not self.waiters and self.size < self.spec.pool.max:
            self.creating += 1
            slot = None
        else:
            slot = await self._wait(deadline, timeout)  # returns with in_use (or creating) already counted
        if slot is None:  # we hold a reserved slot: create the instance ourselves
            return await self._create_reserved(deadline)
        if not self._wants_probe(slot):
            return slot
        try:
            healthy = await self._probe(slot)
        except BaseException:  # cancelled mid-probe: do not trust the instance, do not lose the slot
            self.in_use -= 1
            self.resetting += 1
            self._spawn(self._recycle(slot, healthy=False))
            raise
        if healthy:
            return slot
        # A dead idle instance: destroy it and create a new one in the same reserved slot.
        self.in_use -= 1
        self.creating += 1
        self._note_failed(slot, "failed its health check")
        try:
            await self._unmake(slot)
        except BaseException:
            self.creating -= 1
            self._wake_creator()
            raise
        return await self._create_reserved(deadline)

    async def _create_reserved(self, deadline: float | None) -> S:
        """Create an instance in a slot already counted in ``creating``; free the slot if that fails."""
        try:
            slot = await self._make(deadline)
        except BaseException:
            self.creating -= 1
            self._wake_creator()
            raise
        self.creating -= 1
        self.in_use += 1
        return slot

    async def _wait(self, deadline: float | None, timeout: float | None) -> S | None:
        fut: asyncio.Future[S | None] = asyncio.get_running_loop().create_future()
        self.waiters.append(fut)
        try:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            return await asyncio.wait_for(asyncio.shield(fut), remaining)
        except BaseException as exc:  # timed out, cancelled, or the pool closed
            if fut in self.waiters:
                self.waiters.remove(fut)
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                # Handed an instance (or a slot) in the same moment we gave up: pass it on.
                self._return_handoff(fut.result())
            else:
                fut.cancel()
            if isinstance(exc, TimeoutError):
                self.timeouts += 1
                raise ResourceTimeout(self._timeout_message(timeout)) from None
            raise

    def _return_handoff(self, slot: S | None) -> None:
        """A waiter left (timeout/cancel) after being handed ``slot``: pass it on instead of losing it."""
        if slot is None:
            self.creating -= 1
            self._wake_creator()
        else:
            self.in_use -= 1
            self._give(slot)

    def _give(self, slot: S) -> None:
        """Hand a clean instance to the oldest waiter, or park it idle."""
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                self.in_use += 1
                fut.set_result(slot)
                return
        if self.closed:
            self._spawn(self._unmake(slot))
        else:
            self.idle.append(slot)

    def _wake_creator(self) -> None:
        """A slot came free (an instance was destroyed): let the oldest waiter create a new one."""
        while self.waiters and self.size < self.spec.pool.max:
            fut = self.waiters.popleft()
            if not fut.done():
                self.creating += 1
                fut.set_result(None)
                return

    def _put_back(self, slot: S, healthy: bool) -> None:
        """A lease ended: synchronous bookkeeping, then the reset (or destruction) in the background, so a
        cancellation cannot interrupt it half-way."""
        self.in_use -= 1
        self.resetting += 1
        self._spawn(self._recycle(slot, healthy))

    async def _recycle(self, slot: S, healthy: bool) -> None:
        ok = healthy and not self.closed
        if ok and self.spec.reset:
            try:
                await self._clean(slot)
            except asyncio.CancelledError:
                ok = False
            except Exception as exc:
                ok = False
                self._note_failed(slot, f"reset failed: {type(exc).__name__}: {exc}")
        if ok:
            self.resetting -= 1
            self._give(slot)
            return
        # Still counted (as resetting) until its processes are gone, so a replacement cannot start before
        # the old one has stopped: live instances never exceed max, not even for a moment.
        await self._retire(slot)
        if not self.closed and self.size < self.spec.pool.min:
            self._spawn(self._refill())

    async def _retire(self, slot: S) -> None:
        """Destroy an instance no lease holds (counted in ``resetting`` by the caller) and free its slot."""
        try:
            await self._unmake(slot)
        finally:
            self.resetting -= 1
        self._wake_creator()

    async def _fill_to_min(self, deadline: float | None = None) -> list[BaseException]:
        """Create instances concurrently up to ``min`` (pre-warm); the errors of those that failed."""
        need = self.spec.pool.min - self.size
        if need <= 0 or self.closed:
            return []
        self.creating += need

        async def one() -> None:
            try:
                slot = await self._make(deadline)
            except BaseException:
                self.creating -= 1
                self._wake_creator()
                raise
            self.creating -= 1
            self._give(slot)

        results = await asyncio.gather(*(one() for _ in range(need)), return_exceptions=True)
        return [r for r in results if isinstance(r, BaseException)]

    def _refill_deadline(self) -> float | None:
        return None

    async def _refill(self) -> None:
        for error in await self._fill_to_min(self._refill_deadline()):
            log.warning("could not refill pool %s to min: %s", self.spec.name, error)

    async def _probe_idle(self) -> None:
        """Probe every idle instance once; destroy the dead ones (their slots go to waiters)."""
        for slot in list(self.idle):
            if slot not in self.idle or await self._probe(slot):
                continue
            if slot in self.idle:  # still idle after the probe: nobody took it meanwhile
                self.idle.remove(slot)
                self._note_failed(slot, "failed its health check")
                self.resetting += 1  # counted until it is gone (see _recycle)
                await self._retire(slot)

    async def _close_core(self, why: str, live: list[S]) -> None:
        """Stop handing out, fail every waiter, and destroy every instance in ``live`` (also those in use)."""
        self.closed = True
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                fut.set_exception(ResourceClosed(why))
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.idle.clear()
        await asyncio.gather(*(self._unmake(slot) for slot in live), return_exceptions=True)

    def core_stats(self) -> dict[str, object]:
        """``peak_in_use`` is the most instances held at once since the previous call: the trainer asks once per
        step, between steps, when ``in_use`` is back to 0, so the step's real use is the peak."""
        peak, self.peak_in_use = self.peak_in_use, self.in_use
        return {
            "size": self.size,
            "in_use": self.in_use,
            "peak_in_use": peak,
            "idle": len(self.idle),
            "waiting": sum(1 for f in self.waiters if not f.done()),
            "resetting": self.resetting,
            "creating": self.creating,
        }


class RolloutPool(BasePool, PoolCore[Instance]):
    """``scope="rollout"``: each lease holds an instance of its own, in this process; at most ``max`` exist."""

    def __init__(self, spec: ResourceSpec) -> None:
        BasePool.__init__(self, spec)
        self._init_core()
        self.started = False

    async def start(self) -> None:
        """Create ``min`` instances concurrently (pre-warm) and start the health monitor."""
        if self.started:
            return
        self.started = True
        errors = await self._fill_to_min()
        if errors and not self.closed:
            raise errors[0] if isinstance(errors[0], ResourceError) else ResourceError(str(errors[0]))
        if self.spec.health_check and self.spec.health_interval > 0:
            self._spawn(self._monitor())

    async def acquire(self, owner: str | None, timeout: float | None) -> Lease:
        if self.closed:
            raise ResourceClosed(f"resource engine is closed; cannot acquire {self.spec.name!r}")
        if not self.started:
            await self.start()
        start = time.monotonic()
        slot = await self._obtain(timeout)
        slot.uses += 1
        self.acquires += 1
        self.latency.add(time.monotonic() - start)
        return Lease(self.spec.name, owner, slot)

    # The in-process placement: the resource object itself, started here; the pool's max is its only permit.
    async def _make(self, deadline: float | None) -> Instance:
        return await self._create()

    async def _unmake(self, slot: Instance) -> None:
        await self._destroy(slot)

    async def _probe(self, slot: Instance) -> bool:
        return await self._healthy(slot)

    async def _clean(self, slot: Instance) -> None:
        await slot.resource.reset()

    def _note_failed(self, slot: Instance | None, why: str) -> None:
        self.failed += 1
        self.last_error = why if slot is None or why.startswith("reset") else f"instance {slot.id} {why}"

    def release(self, lease: Lease, healthy: bool) -> None:
        """Give the instance back: reset it in the background, or destroy it when unhealthy."""
        if lease.released:
            return
        lease.released = True
        self._put_back(lease.slot, healthy)

    async def _monitor(self) -> None:
        """Probe idle instances now and then; replace the dead ones."""
        while not self.closed:
            await asyncio.sleep(self.spec.health_interval)
            await self._probe_idle()
            if self.size < self.spec.pool.min:
                await self._refill()

    async def aclose(self) -> None:
        """Stop handing out, fail every waiter, and close every instance (also those in use)."""
        await self._close_core(f"resource engine closed while waiting for {self.spec.name!r}", list(self.instances))

    def stats(self) -> dict[str, object]:
        return {**self.base_stats(), **self.core_stats()}


class GlobalPool(BasePool):
    """``scope="global"``: one instance shared by every lease; release is a reference-count decrement."""

    def __init__(self, spec: ResourceSpec) -> None:
        super().__init__(spec)
        self.current: Instance | None = None
        self.lock = asyncio.Lock()
        self.started = False

    async def start(self) -> None:
        if self.started:
            return
        self.started = True
        if self.spec.pool.min > 0:
            await self._current()

    async def _current(self) -> Instance:
        async with self.lock:
            if self.current is not None and not self.current.retired:
                return self.current
            self.current = await self._create()
            return self.current

    async def acquire(self, owner: str | None, timeout: float | None) -> Lease:
        if self.closed:
            raise ResourceClosed(f"resource engine is closed; cannot acquire {self.spec.name!r}")
        self.started = True
        start = time.monotonic()
        try:
            slot = await asyncio.wait_for(self._current(), timeout)
        except TimeoutError:
            self.timeouts += 1
            raise ResourceTimeout(
                f"the shared {self.spec.name!r} instance did not start within {timeout:g} s; raise acquire_timeout"
            ) from None
        slot.holders += 1
        slot.uses += 1
        self.acquires += 1
        self.latency.add(time.monotonic() - start)
        return Lease(self.spec.name, owner, slot)

    def release(self, lease: Lease, healthy: bool) -> None:
        if lease.released:
            return
        lease.released = True
        slot = lease.slot
        slot.holders -= 1
        if not healthy and not slot.retired:
            # New acquirers get a fresh instance; this one goes when its last holder lets go.
            slot.retired = True
            self.failed += 1
            self.last_error = f"shared instance {slot.id} was reported unhealthy"
            if self.current is slot:
                self.current = None
        if slot.retired and slot.holders == 0:
            self._spawn(self._destroy(slot))

    async def aclose(self) -> None:
        self.closed = True
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.current = None
        await asyncio.gather(*(self._destroy(slot) for slot in list(self.instances)), return_exceptions=True)

    def stats(self) -> dict[str, object]:
        holders = sum(s.holders for s in self.instances)
        # A shared model service (a judge, a reward model) reports its own calls, batches and latency.
        # An async ``stats`` (a shared rate limiter's, read from Redis) is shown through ``isolation`` instead.
        service = getattr(self.current.resource, "stats", None) if self.current is not None else None
        extra = {"service": service()} if callable(service) and not inspect.iscoroutinefunction(service) else {}
        return {
            **extra,
            **self.base_stats(),
            "size": len(self.instances),
            "in_use": holders,
            "peak_in_use": holders,  # one shared instance: held or not
            "idle": 1 if self.current is not None and holders == 0 else 0,
            "waiting": 1 if self.lock.locked() else 0,
            "resetting": 0,
            "creating": 0,
        }


async def _quietly_close(resource: Resource) -> None:
    """Close an instance; if that fails or hangs, kill it. Never raises (except for cancellation)."""
    try:
        await asyncio.wait_for(resource.close(), 30)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            getattr(resource, "kill", lambda: None)()
        raise
    except Exception:
        log.exception("closing %r failed; killing it", resource)
        with contextlib.suppress(Exception):
            getattr(resource, "kill", lambda: None)()
