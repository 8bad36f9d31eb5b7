"""Seeds as one curve: the mean and band of several runs, by hand on small curves, and the compare page's
JSON for each group of runs that differ only by seed (another team's jobs are left out)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from trainer.events import metrics_event
from webapp.monitor.groups import band


def curve(steps: list[float], values: list[float]) -> tuple[np.ndarray, np.ndarray]:
    return np.asarray(steps, dtype=float), np.asarray(values, dtype=float)


def test_the_band_is_the_mean_plus_minus_the_sample_std_of_the_runs_at_each_step() -> None:
    out = band([curve([1, 2, 3], [0.0, 1.0, 2.0]), curve([1, 2, 3], [2.0, 3.0, 4.0])], "std")
    assert out["x"] == [1, 2, 3] and out["mean"] == [1.0, 2.0, 3.0] and out["n"] == [2, 2, 2]
    assert np.allclose(out["upper"], np.array([1, 2, 3]) + np.sqrt(2)) and np.allclose(out["lower"], [1 - np.sqrt(2), 2 - np.sqrt(2), 3 - np.sqrt(2)])


def test_a_run_that_ended_early_leaves_the_later_points_to_the_others_with_no_band() -> None:
    out = band([curve([1, 2, 3], [1.0, 2.0, 3.0]), curve([1], [3.0])], "minmax")
    assert out["mean"] == [2.0, 2.0, 3.0] and out["n"] == [2, 1, 1]
    assert out["lower"] == [1.0, 2.0, 3.0] and out["upper"] == [3.0, 2.0, 3.0]
    std = band([curve([1, 2], [1.0, 2.0]), curve([1], [3.0])], "std")
    assert std["lower"][1] == std["upper"][1] == 2.0


def test_long_runs_are_averaged_per_bucket_so_each_run_weighs_the_same() -> None:
    dense = curve(list(range(1, 101)), [1.0] * 100)  # logs every step
    sparse = curve([10, 60], [3.0, 3.0])  # logs twice
    out = band([dense, sparse], "std", points=2)
    assert len(out["x"]) == 2 and out["mean"] == [2.0, 2.0] and out["n"] == [2, 2]


def test_an_unknown_band_is_refused_naming_the_choices() -> None:
    with pytest.raises(ValueError, match="use one of std, minmax"):
        band([], "iqr")


def seeded(team: Any, user: Any, seed: int, rewards: list[float], lr: float = 1e-4) -> Any:
    from webapp.jobs.models import TrainingJob
    from webapp.monitor.events import append_events

    job = TrainingJob.objects.create(team=team, created_by=user, name=f"seed {seed}", status="succeeded",
                                     config={"steps": len(rewards), "seed": seed, "optim": {"lr": lr}})
    append_events(job.pk, [metrics_event(i + 1, {"reward/mean": r}) for i, r in enumerate(rewards)])
    job.refresh_from_db()
    return job


def test_the_compare_page_draws_each_seed_group_as_a_mean_and_band(
        alice_client: Any, alice: Any, team_a: Any, bob: Any, team_b: Any) -> None:
    a = seeded(team_a, alice, 0, [0.0, 0.5])
    b = seeded(team_a, alice, 1, [1.0, 0.5])
    other_lr = seeded(team_a, alice, 2, [0.3, 0.3], lr=3e-4)
    bobs = seeded(team_b, bob, 3, [9.0, 9.0])
    ids = f"{a.pk},{b.pk},{other_lr.pk},{bobs.pk}"
    page = alice_client.get(f"/monitor/compare/?jobs={a.pk},{b.pk},{other_lr.pk}").content.decode()
    assert 'id="seed-bands"' in page
    answer = alice_client.get(f"/monitor/compare/seed-bands.json?jobs={ids}&band=minmax").json()
    assert answer["metric"] == "reward/mean" and "reward/mean" in answer["metrics"]
    [group] = answer["groups"]
    assert group["jobs"] == [a.pk, b.pk] and group["label"].startswith("seeds 0, 1")
    assert group["mean"] == [0.5, 0.5] and group["lower"] == [0.0, 0.5] and group["upper"] == [1.0, 0.5]
    bob_sees = alice_client.get(f"/monitor/compare/seed-bands.json?jobs={bobs.pk}").json()
    assert bob_sees["groups"] == []
    assert alice_client.get(f"/monitor/compare/seed-bands.json?jobs={a.pk}&band=iqr").status_code == 400
