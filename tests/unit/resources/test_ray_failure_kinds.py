"""Ray's typed failure records map to the failure kinds, whatever their messages say (the real cases, an actor
SIGKILLed on a live node and a removed node, run on a real cluster in tests/integration/resources/
test_ray_backend.py)."""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")

from ray.core.generated.common_pb2 import (  # noqa: E402
    ActorDeathCause,
    ActorDiedErrorContext,
    NodeDeathInfo,
    OomContext,
    RayException,
)

from agentfly.resources.backends.ray import _kind_of_cause, failure_kind  # noqa: E402

# Ray 2.60's own words for a worker SIGKILLed on a live node: they speak of "node deaths".
SIGKILL_TEXT = ("The actor is dead because its worker process has died. ... consider enabling resource isolation "
                "via --enable-resource-isolation to prevent node deaths by resource contention")


def died(reason: int, node_reason: int | None = None) -> ActorDeathCause:
    context = ActorDiedErrorContext(error_message=SIGKILL_TEXT, reason=reason)
    if node_reason is not None:
        context.node_death_info.CopyFrom(NodeDeathInfo(reason=node_reason))
    return ActorDeathCause(actor_died_error_context=context)


def test_a_worker_that_died_on_a_live_node_is_a_crashed_instance_though_its_message_mentions_node_deaths() -> None:
    assert _kind_of_cause(died(ActorDiedErrorContext.WORKER_DIED)) == "instance_crashed"


def test_an_actor_whose_node_died_or_was_preempted_is_a_lost_node() -> None:
    assert _kind_of_cause(died(ActorDiedErrorContext.NODE_DIED, NodeDeathInfo.UNEXPECTED_TERMINATION)) == "node_lost"
    assert _kind_of_cause(died(ActorDiedErrorContext.UNSPECIFIED, NodeDeathInfo.AUTOSCALER_DRAIN_PREEMPTED)) == \
        "node_lost"


def test_an_actor_rays_memory_monitor_killed_is_killed_and_one_that_never_started_is_unhealthy() -> None:
    assert _kind_of_cause(ActorDeathCause(oom_context=OomContext(error_message="node memory"))) == "killed"
    assert _kind_of_cause(ActorDeathCause(creation_task_failure_context=RayException())) == "unhealthy"
    assert _kind_of_cause(ActorDeathCause()) is None  # an empty record says nothing


def test_rays_node_and_memory_errors_are_typed_by_their_class() -> None:
    assert failure_kind(ray.exceptions.NodeDiedError("gone"), "") == "node_lost"
    assert failure_kind(ray.exceptions.OutOfMemoryError("the node's memory ran out"), "") == "killed"
