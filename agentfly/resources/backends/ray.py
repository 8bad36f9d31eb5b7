"""The ``ray`` backend: a job's pools live on a Ray cluster, one pool per resource for the whole job.

    ray start --head --resources='{"sandbox": 64}'        # more nodes: ray start --address=HEAD:6379 ...
    agentfly train grpo.yaml --set resources.backend=ray --set resources.address=auto

Three kinds of actors, all in the namespace ``agentfly``:

- **an instance** (``ResourceActor``): one resource instance (a ``PythonSandbox``, a ScienceWorld, a ``kv``
  store, any factory) built and started *inside* the actor, on whichever node Ray's scheduler picks for the
  spec's custom resources (``{"sandbox": 1}``) and strategy (spread or pack). A sandbox's actor hosts the
  local backend's worker process, so rlimits, the network namespace and Landlock apply on that node.
  Rollouts reach it through ``RayInstance``, a handle whose methods are the resource's, each an explicit
  async round trip.
- **the job's pool coordinator** (``JobCoordinator``, named ``job:<job id>``, detached): holds every
  instance of the job, idle or leased, and hands them out first come first served. Every rank, the async
  producer and the evaluations of a job connect to it by name, so the job never holds more than ``max``
  instances of a resource across the cluster. It owns the instance actors, so they die with it.
- **a team's budget** (``TeamBudget``, named ``team:<team>``, detached): a ledger of instances per resource
  type across the team's jobs; a coordinator takes a permit before creating an instance and gives it back
  when the instance is gone. A job waiting on it shows ``budget_waiting`` in its stats (waiting, not failed).

Leases survive crashes. Each process that acquires registers an owner token, a small actor it owns: Ray
kills that token when the process dies (fate sharing). The coordinator pings the tokens every
``lease_check_interval`` seconds and reclaims the leases of dead owners: their instances are destroyed (a
dead owner may have left one mid-call) and counted as ``reclaimed``. The bound: a SIGKILLed trainer's
instances are gone within ``lease_check_interval`` + Ray's owner-death detection (about 1 s for a process;
for a lost node the GCS health check, ``health_check_period_ms`` x ``health_check_failure_threshold``).
A coordinator with no live owner for ``orphan_timeout`` seconds stops its instances and exits, so nothing
outlives its job even when the Celery worker that ran it was killed; a job resumed before then finds its
coordinator and gets its whole budget back (the dead owners' leases are reclaimed first).

A call to an instance whose actor died raises ``InfrastructureFailure`` of the kind Ray's typed record says
(``failure_kind``: the error's type, the GCS's death cause of the actor, the node table; never the message):
``node_lost`` when its node died or was preempted, ``killed`` when Ray's memory monitor killed it,
``instance_crashed`` when its process died on a live node; the proxy is then marked dead, so its release
destroys it and the pool creates the next instance on a live node.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import inspect
import itertools
import logging
import os
import pickle
import socket
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any, TypedDict

from agentfly.resources.pool import Instance, Latencies, Lease, PoolCore
from agentfly.resources.spec import (
    InfrastructureFailure,
    ResourceClosed,
    ResourceError,
    ResourceSpec,
    ResourceTimeout,
)

log = logging.getLogger(__name__)
NAMESPACE = "agentfly"
# Coordinators and team ledgers live on the head node: it is the cluster, so they fail only with it.
ON_HEAD = {"node:__internal_head__": 0.001}
STRATEGIES = ("spread", "pack")


@dataclass(frozen=True)
class RaySettings:
    """Where and how a job's pools run on Ray. Every field has an environment variable, so the ranks and the
    producer a job starts agree on them without being told (the web app's worker sets them).

    Attributes:
        address: the cluster: ``auto`` (the one ``ray start`` made on this host), ``ray://head:10001``, or
            ``head:6379``; None starts a private single-node Ray in this process. ``AGENTFLY_RAY_ADDRESS``.
        job: the job id that names its pool coordinator; every process with the same id shares one pool per
            resource. None: a fresh id per engine (a pool of its own). ``AGENTFLY_JOB_ID``.
        team: the team whose budget the job draws on; None: no team budget. ``AGENTFLY_TEAM``.
        team_budget: the team's cluster-wide limit per resource name or kind, e.g. ``{"sandbox": 64}``; set by
            the operator (the last job to start with a budget sets it for the team). ``AGENTFLY_TEAM_BUDGET``
            as ``sandbox=64,scienceworld=8``.
        strategy: ``spread`` instances over the nodes (the default) or ``pack`` them onto as few as fit.
        resources: custom Ray resources each instance asks for, by resource name or kind, e.g.
            ``{"python": {"sandbox": 1}}``; a spec's own ``options["ray"]["resources"]`` wins.
        lease_check_interval: seconds between the coordinator's checks that the lease owners are alive.
        orphan_timeout: seconds a coordinator waits with no live owner before it stops its instances and exits.
        call_timeout: the longest a single call to an instance may take (a lost node's call never hangs).
        node_grace: seconds a call that lost its actor's connection waits for the GCS to decide whether the
            node died (``node_lost``) or only the actor (``instance_crashed``); set it to the cluster's
            ``health_check_period_ms`` x ``health_check_failure_threshold`` (Ray's defaults: 3 s x 5).
    """

    address: str | None = None
    job: str | None = None
    team: str | None = None
    team_budget: dict[str, int] = field(default_factory=dict)
    strategy: str = "spread"
    resources: dict[str, dict[str, float]] = field(default_factory=dict)
    lease_check_interval: float = 1.0
    orphan_timeout: float = 30.0
    call_timeout: float = 600.0
    node_grace: float = 20.0

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"RaySettings(strategy={self.strategy!r}): use one of {STRATEGIES}")
        for key, value in self.team_budget.items():
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"team budget {key}={value!r}: give a whole number of instances >= 0")
        if self.lease_check_interval <= 0 or self.orphan_timeout <= 0 or self.call_timeout <= 0:
            raise ValueError("RaySettings: lease_check_interval, orphan_timeout and call_timeout must be positive")

    @classmethod
    def from_env(cls, **overrides: Any) -> RaySettings:
        """Settings from ``AGENTFLY_RAY_ADDRESS``, ``AGENTFLY_JOB_ID``, ``AGENTFLY_TEAM``,
        ``AGENTFLY_TEAM_BUDGET``, ``AGENTFLY_RAY_STRATEGY``; ``overrides`` that are not None win."""
        env = os.environ
        values: dict[str, Any] = {
            "address": env.get("AGENTFLY_RAY_ADDRESS") or None,
            "job": env.get("AGENTFLY_JOB_ID") or None,
            "team": env.get("AGENTFLY_TEAM") or None,
            "team_budget": parse_budget(env.get("AGENTFLY_TEAM_BUDGET", "")),
            "strategy": env.get("AGENTFLY_RAY_STRATEGY") or "spread",
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


def parse_budget(text: str) -> dict[str, int]:
    """``"sandbox=64, scienceworld=8"`` -> ``{"sandbox": 64, "scienceworld": 8}``; raises naming a bad entry."""
    budget: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not key.strip() or not value.strip().isdigit():
            raise ValueError(f"team budget entry {part!r}: write name=count, e.g. sandbox=64")
        budget[key.strip()] = int(value)
    return budget


def job_id_for(path: str) -> str:
    """A stable job id for a run directory: every rank and a resumed run of the same directory share it."""
    return "run-" + hashlib.sha256(os.path.abspath(path).encode()).hexdigest()[:16]


def coordinator_name(job: str) -> str:
    return f"job:{job}"


def team_name(team: str) -> str:
    return f"team:{team}"


def on_ray(spec: ResourceSpec) -> ResourceSpec:
    """``spec`` with ``backend="ray"``; the backend it had runs inside the actor (``inprocess`` objects and
    ``local`` processes alike: the actor is the process)."""
    if spec.backend == "ray":
        return spec
    ray_options = dict(spec.options.get("ray") or {})
    ray_options.setdefault("inner_backend", spec.backend)
    return replace(spec, backend="ray", options={**spec.options, "ray": ray_options})


def _check_reachable(address: str | None, timeout: float = 5.0) -> None:
    """Refuse at once a cluster address nothing answers at (``ray.init`` would wait minutes on it): a
    ``host:port`` of a head node that is down, misspelt or not started. ``auto``, ``local`` and ``ray://``
    addresses are left to Ray."""
    if not address or address in ("auto", "local") or "://" in address or ":" not in address:
        return
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return
    except (OSError, ValueError) as exc:
        raise ResourceError(
            f"the Ray cluster at {address} does not answer ({type(exc).__name__}: {exc}); start its head "
            "(ray start --head) or fix the address (resources.address, AGENTFLY_RAY_ADDRESS)") from None


def connect(address: str | None) -> None:
    """Join the cluster once per process (``ray.init`` takes seconds: the edge, never per acquire)."""
    import ray

    if ray.is_initialized():
        return
    _check_reachable(address)
    kwargs: dict[str, Any] = {"namespace": NAMESPACE, "include_dashboard": False, "log_to_driver": False,
                              "ignore_reinit_error": True}
    if address is None:
        kwargs["num_cpus"] = 1  # a private Ray for this process: instances ask for no CPU of their own
    # ``ray.init`` retries a cluster that answers but refuses it (a missing or wrong RAY_AUTH_TOKEN) once a
    # minute, forever: joined on a thread of its own, it gets a deadline, and the process a typed failure.
    timeout = float(os.environ.get("AGENTFLY_RAY_CONNECT_TIMEOUT", "120"))
    failed: list[BaseException] = []

    def join() -> None:
        try:
            ray.init(address=address, **kwargs)
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=join, name="ray-connect", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise ResourceError(
            f"could not join the Ray cluster at {address} within {timeout:.0f} s (AGENTFLY_RAY_CONNECT_TIMEOUT): it "
            "answers but did not accept this process; with token authentication (RAY_AUTH_MODE=token) every node "
            "and every process that joins needs the cluster's RAY_AUTH_TOKEN")
    if failed:
        exc = failed[0]
        if not isinstance(exc, Exception):
            raise exc
        # Some Ray versions refuse a missing token at once (AuthenticationError, whose message names
        # RAY_AUTH_TOKEN) instead of retrying: a typed failure all the same, in Ray's own words.
        raise ResourceError(f"could not join the Ray cluster at {address}: {type(exc).__name__}: {exc}") from exc


# ----------------------------------------------------------------------------------------------------------
# Actors. Plain classes; ``ray.remote`` is applied in ``_remote`` so that importing this module needs no Ray.
# ----------------------------------------------------------------------------------------------------------


class _ActorInfo(TypedDict):
    """What an instance actor reports once its resource has started."""

    node_id: str
    host: str
    pid: int
    methods: dict[str, str]  # public method name -> "async" or "sync"
    attrs: dict[str, Any]  # the resource's plain values (see ResourceActor)


class ResourceActor:
    """Hosts one resource instance on a node. Every reply is an envelope, ``("ok", value, attrs)`` or
    ``("raise", exception, attrs)``, so that the agent's own errors (a bad key, a refused request) reach the tool
    with their type, and only the actor's death is an infrastructure failure. ``attrs`` are the resource's plain
    values (numbers, strings, flags and tuples of them) after the call: the handle shows them without a round
    trip of its own."""

    def __init__(self, spec: ResourceSpec) -> None:
        inner = (spec.options.get("ray") or {}).get("inner_backend") or "local"
        self.resource = replace(spec, backend=inner if inner != "ray" else "local").build()

    async def start(self) -> _ActorInfo:
        import ray

        await self.resource.start()
        methods: dict[str, str] = {}
        for name in dir(type(self.resource)):
            if name.startswith("_"):
                continue
            attr = getattr(type(self.resource), name, None)
            if callable(attr):
                methods[name] = "async" if inspect.iscoroutinefunction(attr) else "sync"
        ctx = ray.get_runtime_context()
        return {"node_id": ctx.get_node_id(), "host": socket.gethostname(), "pid": os.getpid(),
                "methods": methods, "attrs": self.attrs()}

    def attrs(self) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for name in dir(self.resource):
            if name.startswith("_"):
                continue
            try:
                value = getattr(self.resource, name)
            except Exception:
                continue
            if _plain(value):
                values[name] = value
        return values

    async def call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, Any, dict[str, Any]]:
        try:
            value = getattr(self.resource, name)
            if callable(value):
                value = value(*args, **kwargs)
                if inspect.isawaitable(value):
                    value = await value
            return ("ok", value, self.attrs())
        except Exception as exc:
            return ("raise", _portable(exc), self.attrs())

    async def reset(self) -> tuple[str, Any, dict[str, Any]]:
        return await self.call("reset", (), {})

    async def health(self) -> bool:
        try:
            return bool(await self.resource.health())
        except Exception:
            return False

    async def close(self) -> None:
        await self.resource.close()


def _plain(value: Any) -> bool:
    """A value a handle may show as it was after the last call: small, immutable, picklable."""
    if value is None or isinstance(value, bool | int | float | str):
        return not isinstance(value, str) or len(value) <= 4096
    return isinstance(value, tuple) and len(value) <= 16 and all(_plain(v) for v in value)


def _portable(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling, else a RuntimeError with its type and message."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")


class OwnerToken:
    """A process's proof of life: the process owns it, so Ray kills it when the process dies."""

    def ping(self) -> bool:
        return True


@dataclass(eq=False)
class _Slot:
    actor: Any
    id: int
    node: str = "pending"
    host: str = ""
    methods: dict[str, str] = field(default_factory=dict)
    pid: int = 0
    attrs: dict[str, Any] = field(default_factory=dict)  # as of its start or its last reset
    idle_since: float = field(default_factory=time.monotonic)
    holders: int = 0


@dataclass(eq=False)
class _Held:
    slot: _Slot
    owner: str
    label: str | None


class _JobPool(PoolCore[_Slot]):
    """One resource's pool inside the coordinator, for the job's processes together: ``PoolCore``'s invariants
    with an instance placed as a Ray actor by Ray's scheduler and paid for, when the job has a team, by a
    permit from the team's budget. ``scope="global"``: one instance, shared by every lease."""

    def __init__(self, coordinator: JobCoordinator, spec: ResourceSpec, settings: RaySettings) -> None:
        self.coordinator, self.spec, self.settings = coordinator, spec, settings
        self._init_core()
        self.shared = spec.scope == "global"
        self.max = 1 if self.shared else spec.pool.max
        self.slots: dict[int, _Slot] = {}
        self.leases: dict[str, _Held] = {}
        self.budget_waiting = 0
        self.created = self.destroyed = self.failed = self.reclaimed = self.timeouts = self.acquires = 0
        self.failed_on: dict[str, int] = {}
        self.reclaimed_on: dict[str, int] = {}
        self.last_error: str | None = None
        self.last_probe = time.monotonic()
        self.shared_slot: _Slot | None = None
        self.shared_lock = asyncio.Lock()
        self.tasks: set[asyncio.Task[None]] = set()
        self.closed = False
        # Instances other jobs of the team wait for (TeamBudget.announce): that many idle instances of this job
        # go back to the team, now or as they come back from their leases, instead of waiting here unused.
        self.team_demand = 0
        self.yielded = 0

    def _budget_key(self) -> str:
        budget = self.settings.team_budget
        return self.spec.name if self.spec.name in budget or self.spec.kind not in budget else str(self.spec.kind)

    # -- the hooks: an actor on the cluster, paid for by the team's budget ------------------------------
    async def _make(self, deadline: float | None) -> _Slot:
        """Take a team permit (waiting for one until ``deadline``), then start an actor that hosts one
        instance; the permit goes back if the actor does not start."""
        import ray

        team = self.coordinator.team
        key = self._budget_key()
        if team is not None:
            self.budget_waiting += 1
            try:
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                granted = await team.acquire.remote(self.coordinator.job, key, remaining)
            finally:
                self.budget_waiting -= 1
            if not granted:
                raise ResourceTimeout(
                    f"team {self.settings.team!r} has used its budget of {key!r} instances across its jobs; "
                    f"waited {remaining or 0:g} s. Raise the team's budget, or wait for its other jobs")
        options: dict[str, Any] = {"num_cpus": 0, "max_restarts": 0, "max_concurrency": 64,
                                   "scheduling_strategy": "SPREAD" if self.settings.strategy == "spread"
                                   else "DEFAULT"}
        custom = (self.spec.options.get("ray") or {}).get("resources") or self.settings.resources.get(
            self.spec.name) or self.settings.resources.get(str(self.spec.kind))
        if custom:
            options["resources"] = dict(custom)
        info: _ActorInfo  # set by the attempt that breaks out of the loop; every other attempt raises
        for attempt in range(3):
            actor = None
            try:
                actor = _remote(ResourceActor).options(**options).remote(self.spec)
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                # A node without room leaves the actor pending: the acquire timeout bounds that wait.
                info = await asyncio.wait_for(actor.start.remote(), remaining)
                break
            except BaseException as exc:
                if actor is not None:
                    with contextlib.suppress(Exception):
                        ray.kill(actor)
                # Placed on a node that died before it started: Ray places the next try on a live one.
                if (isinstance(exc, ray.exceptions.RayActorError | ray.exceptions.NodeDiedError) and attempt < 2
                        and (deadline is None or time.monotonic() < deadline)
                        and await asyncio.to_thread(failure_kind, exc, "") == "node_lost"):
                    self._note_failed(None, f"a node died while starting an instance: {exc}")
                    continue
                if team is not None:
                    team.release.remote(self.coordinator.job, key)
                if isinstance(exc, TimeoutError):
                    self.timeouts += 1
                    raise ResourceTimeout(
                        f"no node of the Ray cluster had room for a {self.spec.name!r} instance in time (it asks "
                        f"for {options.get('resources') or 'no custom resource'}); add nodes or raise "
                        "acquire_timeout") from None
                if isinstance(exc, Exception):
                    self.failed += 1
                    self.last_error = f"{type(exc).__name__}: {exc}"
                    raise InfrastructureFailure(
                        f"could not start a {self.spec.name!r} instance on the Ray cluster: {type(exc).__name__}: "
                        f"{exc}", "unhealthy") from None
                raise
        self.created += 1
        slot = _Slot(actor, next(_slot_ids), info["node_id"], info["host"], info["methods"], pid=info["pid"],
                     attrs=info["attrs"])
        self.slots[slot.id] = slot
        return slot

    async def _unmake(self, slot: _Slot) -> None:
        import ray

        if self.slots.pop(slot.id, None) is None:
            return
        self.destroyed += 1
        with contextlib.suppress(Exception):
            await asyncio.wait_for(slot.actor.close.remote(), 10)
        with contextlib.suppress(Exception):
            ray.kill(slot.actor)
        if self.coordinator.team is not None:
            self.coordinator.team.release.remote(self.coordinator.job, self._budget_key())

    async def _probe(self, slot: _Slot) -> bool:
        try:
            return bool(await asyncio.wait_for(slot.actor.health.remote(), 10))
        except Exception:
            return False

    async def _clean(self, slot: _Slot) -> None:
        status, value, slot.attrs = await asyncio.wait_for(slot.actor.reset.remote(), 60)
        if status != "ok":
            raise value

    def _wants_probe(self, slot: _Slot) -> bool:
        # An instance that sat idle a while may have lost its node; a fresh one (reset a moment ago) is trusted.
        return self.spec.health_check and time.monotonic() - slot.idle_since > 1.0

    def _note_failed(self, slot: _Slot | None, why: str) -> None:
        self.failed += 1
        node = "pending" if slot is None else slot.node
        self.failed_on[node] = self.failed_on.get(node, 0) + 1
        self.last_error = why if slot is None or why.startswith("reset") else (
            f"instance {slot.id} on node {slot.node[:12]} {why}")

    def _timeout_message(self, timeout: float | None) -> str:
        return (f"no {self.spec.name!r} instance became free within {timeout:g} s: the job's pool is at its "
                f"max of {self.max} across the cluster ({self.in_use} in use, {len(self.waiters)} waiting). "
                "Raise the pool's max, raise acquire_timeout, or run fewer rollouts at once.")

    def _refill_deadline(self) -> float | None:
        return None if self.spec.acquire_timeout is None else time.monotonic() + self.spec.acquire_timeout

    def _give(self, slot: _Slot) -> None:
        slot.idle_since = time.monotonic()
        super()._give(slot)
        self._yield_idle()

    # -- the team's share ----------------------------------------------------------------------------
    def set_team_demand(self, wanted: int) -> None:
        """Another job of the team waits for ``wanted`` instances of this pool's budget key."""
        self.team_demand = max(0, wanted)
        self._yield_idle()

    def _yield_idle(self) -> None:
        """Give idle instances back to the team while another job of it waits and none of ours does: a
        team's budget is shared between its jobs the way a pool is shared between rollouts."""
        while self.team_demand > 0 and self.idle and not self.waiters and not self.closed:
            slot = self.idle.pop()
            self.team_demand -= 1
            self.yielded += 1
            self.resetting += 1  # counted until it is gone, like any instance on its way out
            self._spawn(self._retire(slot))  # its permit goes back to the team, which hands it to the waiter

    # -- leases ----------------------------------------------------------------------------------------
    async def acquire(self, owner: str, label: str | None, timeout: float | None,
                      known: frozenset[int] = frozenset()) -> dict[str, Any]:
        if self.closed:
            return {"error": "closed", "message": f"the job's pool of {self.spec.name!r} is closed"}
        start = time.monotonic()
        try:
            slot = await (self._shared() if self.shared else self._obtain(timeout))
        except ResourceTimeout as exc:
            return {"error": "acquire_timeout", "message": str(exc)}
        except InfrastructureFailure as exc:
            return {"error": exc.kind, "message": str(exc)}
        except ResourceError as exc:
            return {"error": "closed", "message": str(exc)}
        lease_id = uuid.uuid4().hex
        slot.holders += 1
        self.leases[lease_id] = _Held(slot, owner, label)
        self.acquires += 1
        # The instance's plain values as its reset left them: what the rollout's handle shows before its first call.
        reply = {"lease": lease_id, "slot": slot.id, "waited": time.monotonic() - start, "attrs": slot.attrs}
        if slot.id not in known:
            # A handle costs its receiver a registration with Ray's reference counting: each process gets it
            # once per instance and keeps it, so a warm acquire is one small round trip.
            reply.update(actor=slot.actor, node=slot.node, host=slot.host, methods=slot.methods, pid=slot.pid)
        return reply

    async def _shared(self) -> _Slot:
        async with self.shared_lock:
            if self.shared_slot is None or self.shared_slot.id not in self.slots:
                self.creating += 1
                try:
                    self.shared_slot = await self._make(None)
                finally:
                    self.creating -= 1
            return self.shared_slot

    def release(self, lease_id: str, healthy: bool, reclaimed: bool = False) -> None:
        held = self.leases.pop(lease_id, None)
        if held is None:
            return
        slot = held.slot
        slot.holders -= 1
        if reclaimed:
            self.reclaimed += 1
            self.reclaimed_on[slot.node] = self.reclaimed_on.get(slot.node, 0) + 1
        if self.shared:
            if (not healthy or reclaimed) and self.shared_slot is slot:
                self.shared_slot = None  # new acquirers get a fresh one; this goes with its last holder
            if slot.holders == 0 and self.shared_slot is not slot:
                self._spawn(self._unmake(slot))
            return
        # A dead owner may have left its instance mid-call: never reuse it.
        self._put_back(slot, healthy and not reclaimed)

    async def fill_to_min(self) -> None:
        if self.shared:
            if self.spec.pool.min > 0:
                await self._shared()
            return
        for error in await self._fill_to_min(self._refill_deadline()):
            log.warning("could not pre-warm %s: %s", self.spec.name, error)

    async def check(self) -> None:
        """Probe idle instances every ``health_interval`` (the dead ones, e.g. on a lost node, are replaced) and
        refill to ``min``."""
        now = time.monotonic()
        if self.spec.health_check and self.spec.health_interval > 0 and (
                now - self.last_probe >= self.spec.health_interval):
            self.last_probe = now
            await self._probe_idle()
        if self.size < self.spec.pool.min:
            await self.fill_to_min()

    async def close(self) -> None:
        await self._close_core(f"the job's pool of {self.spec.name!r} closed", list(self.slots.values()))
        self.leases.clear()

    def stats(self) -> dict[str, Any]:
        nodes: dict[str, dict[str, int]] = {}

        def node(n: str) -> dict[str, int]:
            return nodes.setdefault(n, {"in_use": 0, "idle": 0, "starting": 0, "failed": 0, "reclaimed": 0})

        leased = {id(h.slot) for h in self.leases.values()}
        for slot in self.slots.values():
            node(slot.node)["in_use" if id(slot) in leased else "idle"] += 1
        if self.creating:
            node("pending")["starting"] += self.creating
        for n, count in self.failed_on.items():
            node(n)["failed"] += count
        for n, count in self.reclaimed_on.items():
            node(n)["reclaimed"] += count
        core = self.core_stats()
        if self.shared:
            core.update(size=len(self.slots) + self.creating, in_use=len(leased), idle=0)
        return {
            **core, "budget_waiting": self.budget_waiting, "created": self.created,
            "destroyed": self.destroyed, "failed": self.failed, "reclaimed": self.reclaimed,
            "timeouts": self.timeouts, "cluster_acquires": self.acquires, "last_error": self.last_error,
            "max": self.max, "nodes": nodes, "yielded_to_team": self.yielded,
        }


_slot_ids = itertools.count(1)


class JobCoordinator:
    """The job's pools, one per resource, for every process of the job (a named, detached async actor)."""

    def __init__(self, job: str, settings: RaySettings) -> None:
        import ray

        self.job, self.settings = job, settings
        self.pools: dict[str, _JobPool] = {}
        self.owners: dict[str, Any] = {}
        self.team: Any = None
        if settings.team is not None:
            self.team = _remote(TeamBudget).options(
                name=team_name(settings.team), namespace=NAMESPACE, lifetime="detached", get_if_exists=True,
                num_cpus=0, resources=ON_HEAD).remote(settings.team)
            if settings.team_budget:
                self.team.set_budget.remote(settings.team_budget)
            self.team.join.remote(job, ray.get_runtime_context().current_actor)
        self.orphan_since: float | None = time.monotonic()
        self.started = False

    async def ensure(self, spec: ResourceSpec) -> dict[str, Any]:
        """Declare a pool (the first process to declare a resource sets its spec) and pre-warm its ``min``."""
        if not self.started:
            self.started = True
            asyncio.get_running_loop().create_task(self._watch())
        pool = self.pools.get(spec.name)
        if pool is None:
            pool = self.pools[spec.name] = _JobPool(self, spec, self.settings)
        elif pool.spec.pool != spec.pool:
            log.warning("job %s: %s declared with %s and %s; keeping the first", self.job, spec.name,
                        pool.spec.pool, spec.pool)
        await pool.fill_to_min()
        return {"max": pool.max}

    async def register(self, owner: str, token: Any) -> None:
        self.owners[owner] = token
        self.orphan_since = None

    async def unregister(self, owner: str) -> None:
        """An owner closed cleanly: its leases are released (destroyed), and the last one out closes the job."""
        self.owners.pop(owner, None)
        self._reclaim(owner, counted=False)
        if not self.owners:
            # After this call has answered, and only if nobody joined meanwhile (a rank starting late).
            asyncio.get_running_loop().call_later(0.2, lambda: asyncio.ensure_future(self._shutdown(idle_only=True)))

    async def acquire(self, name: str, owner: str, label: str | None, timeout: float | None,
                      known: frozenset[int] = frozenset()) -> dict[str, Any]:
        pool = self.pools.get(name)
        if pool is None:
            return {"error": "closed", "message": f"resource {name!r} was not declared for job {self.job}"}
        return await pool.acquire(owner, label, timeout, known)

    async def release(self, name: str, lease_id: str, healthy: bool) -> None:
        pool = self.pools.get(name)
        if pool is not None:
            pool.release(lease_id, healthy)

    async def stats(self) -> dict[str, Any]:
        return {name: pool.stats() for name, pool in self.pools.items()}

    async def team_demand(self, key: str, wanted: int) -> None:
        """The team's other jobs wait for ``wanted`` instances of budget ``key`` (see TeamBudget.announce)."""
        for pool in self.pools.values():
            if not pool.shared and pool._budget_key() == key:
                pool.set_team_demand(wanted)

    async def ping(self) -> bool:
        return True

    def _reclaim(self, owner: str, counted: bool = True) -> None:
        for pool in self.pools.values():
            for lease_id, held in list(pool.leases.items()):
                if held.owner == owner:
                    pool.release(lease_id, healthy=False, reclaimed=counted)

    async def _watch(self) -> None:
        """Reclaim the leases of dead owners; exit when no owner has been alive for ``orphan_timeout``."""
        import ray

        while True:
            await asyncio.sleep(self.settings.lease_check_interval)
            for owner, token in list(self.owners.items()):
                try:
                    await asyncio.wait_for(token.ping.remote(), 10)
                except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
                    log.warning("job %s: owner %s died; reclaiming its leases", self.job, owner)
                    self.owners.pop(owner, None)
                    self._reclaim(owner)
                except TimeoutError:
                    pass  # busy or partitioned: not proof of death
            if self.owners:
                self.orphan_since = None
            elif self.orphan_since is None:
                self.orphan_since = time.monotonic()
            elif time.monotonic() - self.orphan_since > self.settings.orphan_timeout:
                log.warning("job %s: no live owner for %g s; stopping its instances", self.job,
                            self.settings.orphan_timeout)
                await self._shutdown()
                return
            for pool in self.pools.values():
                with contextlib.suppress(Exception):
                    await pool.check()

    async def _shutdown(self, idle_only: bool = False) -> None:
        """Stop every instance and this actor (Ray then stops any instance actor it still owns)."""
        import ray

        if idle_only and self.owners:
            return
        await asyncio.gather(*(pool.close() for pool in self.pools.values()), return_exceptions=True)
        if self.team is not None:
            with contextlib.suppress(Exception):
                await self.team.leave.remote(self.job)
        ray.kill(ray.get_runtime_context().current_actor, no_restart=True)


class TeamBudget:
    """A team's cluster-wide instances per resource type, shared by its jobs (a named, detached async actor).

    Permits are taken FIFO per key; a job's permits come back when its coordinator dies, whatever killed it. A
    permit follows the instance it pays for, so a job's idle instances would keep the team's budget from a job
    that waits: while one waits, every other job of the team is told how many it waits for
    (``JobCoordinator.team_demand``) and gives that many idle instances back (destroyed: the permit returns)."""

    def __init__(self, team: str) -> None:
        self.team = team
        self.budget: dict[str, int] = {}
        self.used: dict[str, dict[str, int]] = {}
        self.waiters: dict[str, deque[tuple[str, asyncio.Future[bool]]]] = {}
        self.jobs: dict[str, Any] = {}
        self.watching = False
        self.announced: dict[tuple[str, str], int] = {}  # (job, key) -> the demand that job was last told

    async def set_budget(self, budget: dict[str, int]) -> None:
        self.budget = dict(budget)
        for key in list(self.waiters):
            self._wake(key)

    async def join(self, job: str, coordinator: Any) -> None:
        self.jobs[job] = coordinator
        if not self.watching:
            self.watching = True
            asyncio.get_running_loop().create_task(self._watch())

    async def leave(self, job: str) -> None:
        self.jobs.pop(job, None)
        for pair in [p for p in self.announced if p[0] == job]:
            del self.announced[pair]
        for key, by_job in self.used.items():
            if by_job.pop(job, 0):
                self._wake(key)

    def _total(self, key: str) -> int:
        return sum(self.used.get(key, {}).values())

    async def acquire(self, job: str, key: str, timeout: float | None) -> bool:
        limit = self.budget.get(key)
        if limit is None:
            self._take(job, key)
            return True
        queue = self.waiters.setdefault(key, deque())
        if not queue and self._total(key) < limit:
            self._take(job, key)
            return True
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        queue.append((job, fut))
        self.announce(key)
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout)
        except TimeoutError:
            if fut.done() and fut.result():
                self._give_back(job, key)
            fut.cancel()
            return False
        finally:
            with contextlib.suppress(ValueError):
                queue.remove((job, fut))
            self.announce(key)

    def announce(self, key: str) -> None:
        """Tell each job holding permits of ``key`` how many instances the team's *other* jobs wait for."""
        waiting: dict[str, int] = {}
        for job, fut in self.waiters.get(key, ()):
            if not fut.done():
                waiting[job] = waiting.get(job, 0) + 1
        total = sum(waiting.values())
        for job, coordinator in list(self.jobs.items()):
            wanted = total - waiting.get(job, 0) if self.used.get(key, {}).get(job, 0) else 0
            if self.announced.get((job, key), 0) != wanted:
                self.announced[(job, key)] = wanted
                coordinator.team_demand.remote(key, wanted)

    def _take(self, job: str, key: str) -> None:
        by_job = self.used.setdefault(key, {})
        by_job[job] = by_job.get(job, 0) + 1

    async def release(self, job: str, key: str) -> None:
        self._give_back(job, key)

    def _give_back(self, job: str, key: str) -> None:
        by_job = self.used.get(key, {})
        if by_job.get(job, 0) > 0:
            by_job[job] -= 1
        self._wake(key)

    def _wake(self, key: str) -> None:
        queue = self.waiters.get(key)
        limit = self.budget.get(key)
        while queue and (limit is None or self._total(key) < limit):
            job, fut = queue.popleft()
            if not fut.done():
                self._take(job, key)
                fut.set_result(True)
        self.announce(key)

    async def usage(self) -> dict[str, dict[str, Any]]:
        keys = set(self.budget) | set(self.used)
        return {k: {"budget": self.budget.get(k), "in_use": self._total(k),
                    "waiting": sum(1 for _, f in self.waiters.get(k, ()) if not f.done()),
                    "jobs": {j: n for j, n in self.used.get(k, {}).items() if n}} for k in sorted(keys)}

    async def _watch(self) -> None:
        import ray

        while True:
            await asyncio.sleep(2.0)
            for job, coordinator in list(self.jobs.items()):
                try:
                    await asyncio.wait_for(coordinator.ping.remote(), 10)
                except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
                    await self.leave(job)
                except TimeoutError:
                    pass


_remote_classes: dict[type, Any] = {}


def _remote(cls: type) -> Any:
    import ray

    if cls not in _remote_classes:
        _remote_classes[cls] = ray.remote(cls)
    return _remote_classes[cls]


# ----------------------------------------------------------------------------------------------------------
# The client side: what a ResourceEngine in a trainer, rank or producer process holds.
# ----------------------------------------------------------------------------------------------------------

_token: tuple[tuple[int, str, str], Any] | None = None


def _process_token() -> Any:
    """This process's owner token (one per process and Ray session; each pool of each engine is an owner
    holding it). Keyed on the session too: after ``ray.shutdown()`` and ``ray.init()`` on another cluster, a
    handle of the old session's token is unknown there, and Ray aborts the whole process when it is sent."""
    global _token
    import ray

    context = ray.get_runtime_context()
    key = (os.getpid(), context.gcs_address, context.get_node_id())
    if _token is None or _token[0] != key:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        # On this process's own node: a token elsewhere could die with another node and look like our death.
        here = NodeAffinitySchedulingStrategy(context.get_node_id(), soft=False)
        _token = (key, _remote(OwnerToken).options(num_cpus=0, scheduling_strategy=here).remote())
    return _token[1]


class RayInstance:
    """A rollout's handle on an instance actor: the resource's methods, called on the node that runs it.

    Every method of the resource, async or sync, is an async method here (``await box.run(code)``, ``await
    store.follow(key)``): each is an explicit round trip that never blocks the event loop. ``call(name, ...)``
    reaches a method whose name the handle uses itself. The resource's plain values (numbers, strings, flags:
    ``env.score``, ``store.done``) read as they were after the handle's last call, or after the instance's
    reset for a fresh lease, with no round trip; they change only through calls, which this lease alone
    makes. A call to a dead actor raises ``InfrastructureFailure`` (``failure_kind``) and marks the instance
    dead, so that its release destroys it."""

    _own = frozenset({"_actor", "_name", "_methods", "_attrs", "_call_timeout", "_node_grace", "node", "host",
                      "pid", "dead"})

    def __init__(self, actor: Any, name: str, node: str, host: str, methods: dict[str, str],
                 call_timeout: float, node_grace: float = 20.0, pid: int = 0,
                 attrs: dict[str, Any] | None = None) -> None:
        self._actor, self._name, self._methods = actor, name, methods
        self._attrs: dict[str, Any] = dict(attrs or {})
        self.node, self.host, self.pid, self.dead = node, host, pid, False
        self._call_timeout, self._node_grace = call_timeout, node_grace
        for method in methods:
            if method not in self._own and not hasattr(type(self), method):
                object.__setattr__(self, method, functools.partial(self.call, method))

    def __getattr__(self, attr: str) -> Any:
        """Only for names not found on the handle: the resource's plain values as of the last reply."""
        values = self.__dict__.get("_attrs", {})
        if attr in values:
            return values[attr]
        raise AttributeError(f"{self.__dict__.get('_name', 'the')} instance on Ray has no method or plain value "
                             f"{attr!r} (its methods are awaited; values other than numbers, strings and flags "
                             "are reached through a method of the resource)")

    def __setattr__(self, attr: str, value: Any) -> None:
        if attr in self._own:
            object.__setattr__(self, attr, value)
            return
        raise AttributeError(f"cannot set {attr!r} on a {self._name} instance on Ray: it lives in another process; "
                             "change it through a method of the resource")

    async def call(self, attr: str, *args: Any, **kwargs: Any) -> Any:
        """``await handle.call("name", ...)``: the resource's method ``name`` on its node."""
        try:
            status, value, attrs = await asyncio.wait_for(self._actor.call.remote(attr, args, kwargs),
                                                          self._call_timeout)
        except TimeoutError:
            self.dead = True
            raise InfrastructureFailure(f"{self._name} instance on {self.host} did not answer {attr}() within "
                                        f"{self._call_timeout:g} s", "instance_crashed") from None
        except Exception as exc:
            failure = await asyncio.to_thread(self._failure, exc)  # may wait for the GCS: not on the loop
            raise failure from None
        self._attrs = attrs
        if status == "raise":
            raise value
        return value

    def _failure(self, exc: BaseException) -> InfrastructureFailure:
        """The typed failure of a call that met ``exc`` (blocking: it may wait for the GCS, see failure_kind)."""
        import ray

        self.dead = True
        if isinstance(exc, ray.exceptions.GetTimeoutError):
            return InfrastructureFailure(f"{self._name} instance on {self.host} did not answer in time",
                                         "instance_crashed")
        kind = failure_kind(exc, self.node, self._node_grace)
        where = f"node {self.node[:12]} ({self.host})"
        what = {"node_lost": "its node was lost", "killed": "it was killed for memory",
                "unhealthy": "it could not start"}.get(kind, "its actor died")
        return InfrastructureFailure(f"the {self._name} instance on {where} is gone: {what} "
                                     f"({type(exc).__name__})", kind)

    async def start(self) -> None:  # started by the coordinator; the pool never calls these on a lease
        return None

    def kill(self) -> None:
        return None

    def __repr__(self) -> str:
        return f"RayInstance({self._name} on {self.host}, node {self.node[:12]})"


def node_alive(node_id: str) -> bool:
    """Whether the GCS counts ``node_id`` among the live nodes (True when it cannot be asked: no proof of loss)."""
    import ray

    try:
        nodes: list[dict[str, Any]] = ray.nodes()  # type: ignore[no-untyped-call]
        return any(n.get("NodeID") == node_id and n.get("Alive") for n in nodes)
    except Exception:
        return True


def _death_cause(actor_id: str | None) -> Any:
    """The GCS's record of why an actor died (``ActorDeathCause``), or None while it is not dead (or unknown).

    Ray's exception carries only the actor id and ``preempted``; the cause (the worker died, its node died, the
    OOM killer) is kept by the GCS. Read from the GCS itself, not the state API, which needs the dashboard."""
    if not actor_id:
        return None
    try:
        from ray._private.state import actors

        info = actors(actor_id)
    except Exception:
        return None
    return info.get("DeathCause") if info and info.get("State") == "DEAD" else None


def _kind_of_cause(cause: Any) -> str | None:
    """The failure kind of an ``ActorDeathCause``; None when it says nothing (an empty record)."""
    from ray.core.generated import common_pb2

    # Generated protobuf classes: their names are made at import, so mypy sees none of them.
    protos: Any = common_pb2
    ActorDiedErrorContext, NodeDeathInfo = protos.ActorDiedErrorContext, protos.NodeDeathInfo
    which = cause.WhichOneof("context")
    if which == "oom_context":
        return "killed"  # the node's memory monitor killed it: a limit of the host, not the agent's doing
    if which in ("creation_task_failure_context", "runtime_env_failed_context", "actor_unschedulable_context"):
        return "unhealthy"  # it never started
    if which != "actor_died_error_context":
        return None
    context = cause.actor_died_error_context
    lost = (context.reason == ActorDiedErrorContext.NODE_DIED
            or context.node_death_info.reason in (NodeDeathInfo.UNEXPECTED_TERMINATION,
                                                  NodeDeathInfo.AUTOSCALER_DRAIN_PREEMPTED))
    return "node_lost" if lost else "instance_crashed"


def failure_kind(exc: BaseException, node: str, grace: float = 0.0) -> str:
    """The failure kind of a Ray error met calling an instance on ``node``, from the error's type, the GCS's
    record of the actor's death and the node table (``node`` "" when unknown); never from the message (Ray's
    message for an actor SIGKILLed on a live node speaks of "node deaths").

    ``ActorUnavailableError`` (the connection to the actor broke) is not yet a verdict: the GCS declares a
    node dead only after its health check misses, so this waits up to ``grace`` seconds for the GCS to record
    the actor's death or the node's. Blocking: call it off the event loop."""
    import ray

    errors = ray.exceptions
    if isinstance(exc, errors.NodeDiedError):
        return "node_lost"
    if isinstance(exc, errors.OutOfMemoryError):
        return "killed"
    if isinstance(exc, errors.GetTimeoutError | TimeoutError):
        return "instance_crashed"  # it did not answer in time: the instance is the suspect, not its node
    if not isinstance(exc, errors.RayActorError):
        return "node_lost" if node and not node_alive(node) else "instance_crashed"
    if exc.preempted:
        return "node_lost"
    deadline = time.monotonic() + (grace if isinstance(exc, errors.ActorUnavailableError) else 0.0)
    while True:
        cause = _death_cause(exc.actor_id)
        kind = None if cause is None else _kind_of_cause(cause)
        if kind == "node_lost" or (node and not node_alive(node)):
            return "node_lost"
        if kind is not None or time.monotonic() >= deadline:
            return kind or "instance_crashed"
        time.sleep(0.25)


class RayPool:
    """The engine's side of a job's pool: acquires from the job's coordinator, with the ``RolloutPool``
    interface (``start``, ``acquire``, ``release``, ``stats``, ``aclose``, ``kill_all``)."""

    def __init__(self, spec: ResourceSpec, settings: RaySettings | None = None) -> None:
        self.spec = spec
        self.settings = settings or RaySettings.from_env()
        self.job = self.settings.job or f"private-{uuid.uuid4().hex[:12]}"
        self.closed = False
        self.started = False
        self.tasks: set[asyncio.Task[Any]] = set()
        self.instances: set[Instance] = set()  # this process's leased instances
        self.leases: dict[int, str] = {}  # Instance.id -> lease id at the coordinator
        self.slots: dict[int, int] = {}  # Instance.id -> the coordinator's slot id
        # slot id -> actor, node, host, methods, pid
        self.handles: dict[int, tuple[Any, str, str, dict[str, str], int]] = {}
        self.latency = Latencies()
        self.acquires = self.timeouts = self.failed = 0
        self.coordinator: Any = None
        self.owner: str | None = None
        self.last_error: str | None = None
        self._start_lock: asyncio.Lock | None = None

    async def start(self) -> None:
        if self.started:
            return
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if self.started:
                return
            import ray

            connect(self.settings.address)
            self.owner = f"{socket.gethostname()}:{os.getpid()}:{self.spec.name}:{uuid.uuid4().hex[:8]}"
            for attempt in range(5):
                self.coordinator = _remote(JobCoordinator).options(
                    name=coordinator_name(self.job), namespace=NAMESPACE, lifetime="detached", get_if_exists=True,
                    num_cpus=0, max_concurrency=1000, resources=ON_HEAD).remote(self.job, self.settings)
                try:
                    await self.coordinator.register.remote(self.owner, _process_token())
                    break
                except ray.exceptions.RayActorError:
                    # The job's last process left a moment ago and its coordinator is stopping: once its name
                    # is free, this process starts the next one.
                    if attempt == 4:
                        raise
                    await asyncio.sleep(0.5)
            await self.coordinator.ensure.remote(self.spec)
            self.started = True

    async def acquire(self, owner: str | None, timeout: float | None) -> Lease:
        if self.closed:
            raise ResourceClosed(f"resource engine is closed; cannot acquire {self.spec.name!r}")
        await self.start()
        t0 = time.monotonic()
        pending = asyncio.ensure_future(self.coordinator.acquire.remote(
            self.spec.name, self.owner, owner, timeout, frozenset(self.handles)))
        try:
            reply = await asyncio.shield(pending)
        except asyncio.CancelledError:
            # Cancelling our await does not cancel the coordinator's: give back what it grants after we left.
            pending.add_done_callback(self._give_back_late)
            raise
        except Exception as exc:  # the coordinator is gone: the job was stopped (cancel) or the head failed
            raise ResourceClosed(f"the job's pool of {self.spec.name!r} on the Ray cluster is gone (the job was "
                                 f"stopped, or the head node failed): {type(exc).__name__}") from None
        if "error" in reply:
            if reply["error"] == "acquire_timeout":
                self.timeouts += 1
                raise ResourceTimeout(reply["message"])
            if reply["error"] == "closed":
                raise ResourceClosed(reply["message"])
            self.failed += 1
            self.last_error = reply["message"]
            raise InfrastructureFailure(reply["message"], reply["error"])
        if "actor" in reply:
            if len(self.handles) > 2 * self.spec.pool.max + 16:  # instances destroyed since: sent again if needed
                held = set(self.slots.values())
                self.handles = {k: v for k, v in self.handles.items() if k in held}
            self.handles[reply["slot"]] = (reply["actor"], reply["node"], reply["host"], reply["methods"],
                                           reply["pid"])
        actor, node, host, methods, pid = self.handles[reply["slot"]]
        proxy = RayInstance(actor, self.spec.name, node, host, methods, self.settings.call_timeout,
                            self.settings.node_grace, pid, reply["attrs"])
        slot = Instance(proxy)
        slot.uses = 1
        self.instances.add(slot)
        self.leases[slot.id] = reply["lease"]
        self.slots[slot.id] = reply["slot"]
        self.acquires += 1
        self.latency.add(time.monotonic() - t0)
        if self.closed:  # closed while we waited: hand it straight back
            self.release(Lease(self.spec.name, owner, slot), healthy=True)
            raise ResourceClosed(f"resource engine closed while acquiring {self.spec.name!r}")
        return Lease(self.spec.name, owner, slot)

    def _give_back_late(self, pending: asyncio.Future[Any]) -> None:
        if pending.cancelled() or pending.exception() is not None:
            return
        reply = pending.result()
        if "lease" in reply and self.coordinator is not None:
            self.coordinator.release.remote(self.spec.name, reply["lease"], True)

    def release(self, lease: Lease, healthy: bool) -> None:
        """Synchronous bookkeeping; the coordinator resets (or destroys) the instance in the background."""
        if lease.released:
            return
        lease.released = True
        self.instances.discard(lease.slot)
        lease_id = self.leases.pop(lease.slot.id, None)
        slot_id = self.slots.pop(lease.slot.id, None)
        if lease_id is not None and self.coordinator is not None:
            dead = getattr(lease.slot.resource, "dead", False)
            if dead or not healthy:  # destroyed at the coordinator: its handle is of no more use
                self.handles.pop(slot_id or 0, None)
            self.coordinator.release.remote(self.spec.name, lease_id, healthy and not dead)

    def stats(self) -> dict[str, Any]:
        p50, p99 = self.latency.percentile(50), self.latency.percentile(99)
        stats: dict[str, Any] = {
            "kind": self.spec.kind, "scope": self.spec.scope, "backend": "ray", "min": self.spec.pool.min,
            "max": self.spec.pool.max if self.spec.scope == "rollout" else 1, "job": self.job,
            "acquires": self.acquires, "timeouts": self.timeouts, "failed": self.failed,
            "acquire_p50_ms": None if p50 is None else round(p50 * 1000, 3),
            "acquire_p99_ms": None if p99 is None else round(p99 * 1000, 3), "last_error": self.last_error,
            "held_here": len(self.instances),
        }
        if self.coordinator is None:
            return {**stats, "size": 0, "in_use": 0, "idle": 0, "waiting": 0, "resetting": 0, "creating": 0,
                    "created": 0, "destroyed": 0, "reclaimed": 0, "nodes": {}}
        import ray

        try:
            cluster = ray.get(self.coordinator.stats.remote(), timeout=5).get(self.spec.name, {})
        except Exception as exc:
            cluster = {"last_error": f"the job's coordinator did not answer: {type(exc).__name__}"}
        timeouts, failed = cluster.pop("timeouts", 0), cluster.pop("failed", 0)
        merged = {**stats, **{k: v for k, v in cluster.items() if v is not None or k not in stats}}
        merged["timeouts"] = max(self.timeouts, timeouts)
        merged["failed"] = self.failed + failed
        if self.settings.team is not None:
            with contextlib.suppress(Exception):
                team = ray.get_actor(team_name(self.settings.team), namespace=NAMESPACE)
                usage: Any = ray.get(team.usage.remote(), timeout=5)
                key = self.spec.name if self.spec.name in usage else str(self.spec.kind)
                if key in usage:
                    merged["team_budget"] = {"team": self.settings.team, "key": key, **usage[key]}
        return merged

    async def aclose(self) -> None:
        """Give back what this process holds and leave the job; the last process out closes the job's pools."""
        if self.closed:
            return
        self.closed = True
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.coordinator is not None:
            for slot in list(self.instances):
                self.release(Lease(self.spec.name, None, slot), healthy=False)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.coordinator.unregister.remote(self.owner), 30)

    def kill_all(self) -> None:
        """Interpreter exit or SIGTERM: leave the job without waiting (the coordinator destroys our leases)."""
        import ray

        self.closed = True
        # Never after ray.shutdown(): a call then would start a new local Ray at interpreter exit.
        if self.coordinator is not None and ray.is_initialized():
            with contextlib.suppress(Exception):
                self.coordinator.unregister.remote(self.owner)
        self.instances.clear()


def stop_job(job: str, address: str | None = None) -> bool:
    """Stop a job's coordinator and every instance it owns (the web app calls this when a job ends, fails or
    is cancelled). True if there was one to stop."""
    import ray

    connect(address)
    try:
        actor = ray.get_actor(coordinator_name(job), namespace=NAMESPACE)
    except ValueError:
        return False
    ray.kill(actor, no_restart=True)  # its instance actors are owned by it, so Ray stops them too
    return True
