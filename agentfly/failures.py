"""The typed failures of the infrastructure, which every layer raises and the rollout layer sorts by kind.

Below both the resource layer (pools, backends) and the engines (a remote fleet that stops answering), so
that neither imports the other for them; ``agentfly.resources`` exports the same names.
"""

from __future__ import annotations

from typing import Any


class ResourceError(RuntimeError):
    """A resource could not be created, reset or reached."""


FAILURE_KINDS: tuple[str, ...] = (
    "acquire_timeout",  # no instance became free in time (pool at max, or a team budget used up)
    "instance_crashed",  # the process, container or actor behind an instance died mid-call
    "node_lost",  # the cluster node that ran the instance went away
    "unhealthy",  # the instance failed its health check or could not be started or reset
    "server_down",  # a model service, MCP server or web API stopped answering
    "breaker_open",  # a circuit breaker refused the call after repeated failures
    "killed",  # a sandbox killed for a reason the agent did not cause (a limit of the host, a shutdown)
    "client_lost",  # an agent driving a rollout through the gateway stopped calling it (agentfly.gateway)
    "no_client",  # no agent took a rollout the gateway handed out, within its take_timeout
)


class InfrastructureFailure(ResourceError):
    """A failure of the infrastructure, never of the agent: the rollout that met it ends with ``failure``.

    A tool's own error caused by the agent's input (bad arguments, an exception in the agent's code inside a
    sandbox) is an observation the model reads. This is the other kind: the sandbox died, the node was lost,
    the server stopped answering. The rollout layer ends the trajectory with ``failure=kind`` and
    ``failure_reason=str(exc)``; the trainer leaves it out of its group's statistics and out of the loss, and
    counts it per step (``rollout/infra_failure/<kind>``).
    """

    def __init__(self, reason: str, kind: str = "instance_crashed") -> None:
        if kind not in FAILURE_KINDS:
            raise ValueError(f"InfrastructureFailure kind={kind!r}; use one of {FAILURE_KINDS}")
        super().__init__(reason)
        self.kind = kind

    def __reduce__(self) -> tuple[Any, ...]:  # keep the kind across processes (Ray, multiprocessing)
        return (type(self), (str(self), self.kind))


class ResourceTimeout(InfrastructureFailure):
    """No instance became free within the acquire timeout (the pool is at ``max`` and all are in use).

    Deliberately not a ``TimeoutError``: ``Tool.invoke`` reports those as "the tool timed out", and the
    model should read that it waited for a busy resource, not that its own call was slow. It is an
    infrastructure failure: the agent did nothing to cause it.
    """

    def __init__(self, reason: str, kind: str = "acquire_timeout") -> None:
        super().__init__(reason, kind)
