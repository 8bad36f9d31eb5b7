"""The host sample of a ``resources`` event: CPU and memory always, GPUs through NVML where there are any,
and a stated reason where there are none (never an empty list that reads as "idle GPUs")."""

from __future__ import annotations

import importlib.util
import json

from trainer.events import CallbackSink, Event, EventStream, gpu_stats, host_stats


def test_a_host_sample_reports_cpu_and_memory_of_the_machine_and_the_process() -> None:
    host_stats()  # psutil's CPU percentages are "since the previous call"
    stats = host_stats()
    assert 0.0 <= stats["cpu_percent"] <= 100.0
    assert stats["cpu_count"] >= 1
    assert 0 < stats["memory_used_mb"] <= stats["memory_total_mb"]
    assert stats["process_rss_mb"] > 10  # this Python process with torch loaded
    assert stats["threads"] >= 1
    json.dumps(stats)  # goes into a JSON event as it is


def test_gpus_are_listed_or_their_absence_is_explained() -> None:
    gpus, absent = gpu_stats()
    if importlib.util.find_spec("pynvml") is None:
        assert gpus == []
        assert absent is not None and "nvidia-ml-py is not installed" in absent
    elif absent is None:  # a GPU machine: every device with its utilisation and memory
        assert gpus and all({"index", "name", "util_percent", "memory_used_mb", "memory_total_mb"} <= set(g)
                            for g in gpus)
    elif gpus:  # some devices were read before NVML failed
        assert "failed" in absent
    else:
        assert "NVML" in absent or "driver" in absent


def test_a_resources_event_carries_the_host_the_engines_stats_and_the_pools() -> None:
    got: list[Event] = []
    pools = {"python": {"size": 2, "in_use": 1, "idle": 1, "waiting": 0, "created": 2, "failed": 0}}
    stream = EventStream([CallbackSink(got.append)])
    stream.resources(4, {"sequences": 8.0, "generated_tokens": 96.0}, pools)
    stream.resources(5, {})
    (first, second) = (e["data"] for e in got)
    assert first["pools"] == pools and first["engine"] == {"sequences": 8.0, "generated_tokens": 96.0}
    assert set(first["host"]) >= {"cpu_percent", "memory_percent", "process_rss_mb", "gpus", "gpu_absent"}
    assert second["pools"] == {} and second["engine"] == {}
