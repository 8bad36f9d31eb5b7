"""The worker's resource sample: CPU and memory always, GPUs through NVML where there are any, and a stated
reason where there are none (never an empty list that reads as "idle GPUs")."""

from __future__ import annotations

import importlib.util
import json

from webapp.monitor import sampling


def test_a_worker_sample_reports_cpu_and_memory_of_the_machine_and_the_process() -> None:
    sampling.worker_stats()  # psutil's CPU percentages are "since the previous call"
    stats = sampling.worker_stats()
    assert 0.0 <= stats["cpu_percent"] <= 100.0
    assert stats["cpu_count"] >= 1
    assert 0 < stats["memory_used_mb"] <= stats["memory_total_mb"]
    assert stats["process_rss_mb"] > 10  # this Python process with Django loaded
    assert stats["threads"] >= 1
    json.dumps(stats)  # goes into a JSON event as it is


def test_gpus_are_listed_or_their_absence_is_explained() -> None:
    gpus, absent = sampling.gpu_stats()
    if importlib.util.find_spec("pynvml") is None:
        assert gpus == []
        assert absent is not None and "nvidia-ml-py is not installed" in absent
    elif absent is None:  # a GPU machine: every device with its utilisation and memory
        assert gpus and all({"index", "name", "util_percent", "memory_used_mb", "memory_total_mb"} <= set(g)
                            for g in gpus)
    elif gpus:  # NVML read some devices, then one failed (fell off the bus): those read are kept
        assert absent.startswith("reading NVML failed: ")
    else:  # NVML is installed but there is no driver, or it sees no device
        assert absent == "NVML found no GPU on this worker" or absent.startswith(
            "no NVIDIA driver or GPU on this worker (")


def test_a_resource_snapshot_carries_the_pools_of_the_jobs_resource_engine() -> None:
    pools = {"python": {"size": 2, "in_use": 1, "idle": 1, "waiting": 0, "created": 2, "failed": 0}}
    snapshot = sampling.resource_snapshot(pools)
    assert snapshot["pools"] == pools
    assert set(snapshot["worker"]) >= {"cpu_percent", "memory_percent", "gpus", "gpu_absent"}
    assert sampling.resource_snapshot()["pools"] == {}
