"""A real Ray cluster of several nodes on this machine (``ray.cluster_utils.Cluster``) for one test module:
a head without custom resources, then one node of one CPU per ``nodes`` entry with those custom resources;
this process is connected to it while it is in use, and everything is shut down afterwards."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def ray_cluster(*nodes: dict[str, float], system_config: dict[str, Any] | None = None) -> Iterator[Any]:
    import ray
    from ray.cluster_utils import Cluster

    head: dict[str, Any] = {"num_cpus": 1, "include_dashboard": False}
    if system_config:
        head["_system_config"] = system_config
    cluster = Cluster(initialize_head=True, head_node_args=head)
    for resources in nodes:
        cluster.add_node(num_cpus=1, resources=resources)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
