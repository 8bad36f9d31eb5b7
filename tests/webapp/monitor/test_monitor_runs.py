"""The compare page's tables: only the settings that differ, the hyperparameters with final metrics, and runs
that differ only by seed as mean ± std (hand-computed)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from webapp.monitor.runs import config_diff, flatten, hyperparameter_rows, seed_groups


def config(seed: int, lr: float = 1e-4, group: int = 4) -> dict[str, Any]:
    return {"seed": seed, "steps": 50, "model": {"path": f"/runs/team-a/tiny-{seed}", "build_tiny": True, "tiny_seed": seed},
            "data": {"task": "arithmetic", "seed": seed}, "optim": {"lr": lr},
            "rollout": {"group_size": group, "tools": ["calc"]}, "algorithm": {"name": "grpo"}}


def job(pk: int, cfg: dict[str, Any], **final: float) -> Any:
    return SimpleNamespace(pk=pk, name=f"job {pk}", config=cfg, final_metrics={k.replace("__", "/"): v for k, v in final.items()})


def test_flatten_writes_nested_keys_with_dots_and_keeps_lists_whole() -> None:
    assert flatten({"a": {"b": 1, "c": [1, 2]}, "d": {}}) == {"a.b": 1, "a.c": [1, 2], "d": {}}


def test_the_config_diff_lists_only_the_keys_that_differ() -> None:
    diff = dict(config_diff([config(0), config(0, lr=3e-4), config(0, group=8)]))
    assert diff == {"optim.lr": [1e-4, 3e-4, 1e-4], "rollout.group_size": [4, 4, 8]}


def test_runs_that_differ_only_by_seed_are_one_group_with_mean_and_sample_std() -> None:
    jobs = [job(1, config(0), eval__accuracy=0.5), job(2, config(1), eval__accuracy=0.7),
            job(3, config(2), eval__accuracy=0.9), job(4, config(0, lr=3e-4), eval__accuracy=0.1)]
    [group] = seed_groups(jobs)
    assert [j.pk for j in group["jobs"]] == [1, 2, 3] and group["seeds"] == [0, 1, 2]
    mean, std, n = group["stats"]["eval/accuracy"]
    assert mean == pytest.approx(0.7) and std == pytest.approx(0.2) and n == 3


def test_the_hyperparameter_table_has_the_settings_and_the_final_metrics_present() -> None:
    columns, metrics, rows = hyperparameter_rows([job(1, config(0), eval__accuracy=0.5, reward__mean=0.4),
                                                  job(2, config(1, lr=3e-4))])
    assert columns[:3] == ["algorithm", "task", "lr"] and metrics == ["eval/accuracy", "reward/mean"]
    assert rows[0][1][:3] == ["grpo", "arithmetic", 1e-4] and rows[0][2] == [0.5, 0.4]
    assert rows[1][1][2] == 3e-4 and rows[1][2] == [None, None]
