"""A Ray cluster address that nothing answers at is refused within seconds, naming the address and the fix,
instead of ``ray.init`` waiting minutes on it (a job's end would hold its worker that long)."""

from __future__ import annotations

import socket

import pytest
import ray

from agentfly.resources import ResourceError
from agentfly.resources.backends.ray import stop_job


def test_a_cluster_address_nothing_answers_at_is_refused_within_seconds_naming_it() -> None:
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ResourceError) as refused:
        stop_job("job-1", f"127.0.0.1:{port}")
    # Refused by the reachability check before ray.init, which would wait minutes on a silent address.
    assert not ray.is_initialized()
    assert f"the Ray cluster at 127.0.0.1:{port} does not answer" in str(refused.value)
    assert "ray start --head" in str(refused.value)


def test_a_head_name_that_does_not_resolve_is_refused_the_same_way() -> None:
    with pytest.raises(ResourceError, match=r"the Ray cluster at ray-head\.invalid:6379 does not answer"):
        stop_job("job-1", "ray-head.invalid:6379")
