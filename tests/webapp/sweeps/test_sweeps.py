"""Sweeps: a grid or random sweep launches one job per run from a job's settings, every run through the launch
rules and all of them or none within the team's quota; the group page picks the best run by a chosen metric;
another team neither sees a sweep nor sweeps from its jobs."""

from __future__ import annotations

from typing import Any

import pytest

from tests.webapp.factories import builtin_entries, launch_tiny_job
from trainer.events import metrics_event
from webapp.jobs.models import TeamQuota, TrainingJob
from webapp.sweeps.actions import SweepRefused, expand
from webapp.sweeps.models import Sweep


@pytest.fixture
def base_job(alice_api: Any, team_a: Any) -> TrainingJob:
    tool, reward = builtin_entries()
    job = TrainingJob.objects.get(pk=launch_tiny_job(alice_api, {"calculator": tool, "math_equal": reward},
                                                     name="base"))
    TrainingJob.objects.filter(pk=job.pk).update(status="succeeded")  # not counted against the quota
    return job


def sweep(api: Any, base: TrainingJob, **fields: Any) -> Any:
    return api.post("/api/sweeps/", {"base_job": base.pk, "name": "lr sweep", "kind": "grid",
                                     "fields": {"learning_rate": [1e-4, 3e-4], "seed": [0, 1]}, **fields},
                    format="json")


def test_a_grid_sweep_launches_every_combination_as_a_queued_job_of_the_team(alice_api: Any, base_job: Any) -> None:
    response = sweep(alice_api, base_job)
    assert response.status_code == 201, response.content
    runs = response.json()["runs"]
    assert [r["params"] for r in runs] == [{"learning_rate": 1e-4, "seed": 0}, {"learning_rate": 1e-4, "seed": 1},
                                           {"learning_rate": 3e-4, "seed": 0}, {"learning_rate": 3e-4, "seed": 1}]
    for run in runs:
        job = TrainingJob.objects.get(pk=run["job"])
        assert job.status == "queued" and job.team == base_job.team
        assert job.config["optim"]["lr"] == run["params"]["learning_rate"] and job.config["seed"] == run["params"]["seed"]
        assert job.config["steps"] == base_job.config["steps"]  # the rest is the base job's


def test_a_sweep_that_does_not_fit_the_quota_is_refused_whole(alice_api: Any, base_job: Any, team_a: Any) -> None:
    TeamQuota.objects.create(team=team_a, concurrent_jobs=3)
    response = sweep(alice_api, base_job)
    assert response.status_code == 403
    assert "4 runs do not fit" in response.json()["detail"] and "sweep at most 3 runs" in response.json()["detail"]
    assert TrainingJob.objects.count() == 1 and not Sweep.objects.exists()


def test_a_run_the_launch_rules_refuse_is_named_and_nothing_is_launched(alice_api: Any, base_job: Any) -> None:
    response = sweep(alice_api, base_job, fields={"learning_rate": [1e-4, 5.0]})
    assert response.status_code == 400
    assert "run 2 (learning_rate=5.0) is refused: learning_rate:" in response.json()["detail"]
    assert TrainingJob.objects.count() == 1
    bad = sweep(alice_api, base_job, fields={"team": [1]})
    assert bad.status_code == 400 and "team cannot be swept; sweep some of: learning_rate" in bad.json()["detail"]


def test_a_random_sweep_draws_count_runs_in_its_ranges_the_same_for_the_same_seed() -> None:
    space = {"learning_rate": {"min": 1e-5, "max": 1e-3, "log": True}, "group_size": [2, 4]}
    runs = expand("random", space, count=5, seed=7)
    assert runs == expand("random", space, count=5, seed=7) and len(runs) == 5
    assert all(1e-5 <= r["learning_rate"] <= 1e-3 and r["group_size"] in (2, 4) for r in runs)
    with pytest.raises(SweepRefused, match=r"a range .* needs a random sweep"):
        expand("grid", space)
    with pytest.raises(SweepRefused, match="more than 32"):
        expand("grid", {"seed": list(range(6)), "learning_rate": [1e-4] * 6})


def test_the_group_page_picks_the_best_run_by_the_chosen_metric(alice_api: Any, alice_client: Any,
                                                                base_job: Any) -> None:
    from webapp.monitor.events import append_events

    runs = sweep(alice_api, base_job, fields={"seed": [0, 1, 2]}, metric="reward/mean").json()["runs"]
    for run, rewards in zip(runs, ([0.1, 0.4], [0.2, 0.9], [0.5, 0.3]), strict=True):
        append_events(run["job"], [metrics_event(i + 1, {"reward/mean": r}) for i, r in enumerate(rewards)])
    sweep_id = Sweep.objects.get().pk
    data = alice_client.get(f"/sweeps/{sweep_id}/data.json").json()
    assert data["best"] == runs[1]["job"] and [r["value"] for r in data["runs"]] == [0.4, 0.9, 0.3]
    assert data["runs"][1]["curve"] == {"x": [1.0, 2.0], "y": [0.2, 0.9]}
    lowest = alice_client.get(f"/sweeps/{sweep_id}/?goal=min").content.decode()
    assert f'Best run by <span class="mono">reward/mean</span>: <a href="/jobs/{runs[2]["job"]}/">' in lowest
    assert alice_api.get(f"/api/sweeps/{sweep_id}/").json()["best"] == runs[1]["job"]


def test_another_team_neither_sees_a_sweep_nor_sweeps_from_its_jobs(
        alice_api: Any, bob_api: Any, bob_client: Any, base_job: Any, team_b: Any) -> None:
    sweep_id = sweep(alice_api, base_job).json()["id"]
    assert bob_api.get(f"/api/sweeps/{sweep_id}/").status_code == 404
    assert bob_api.get("/api/sweeps/").json()["results"] == []
    assert bob_client.get(f"/sweeps/{sweep_id}/").status_code == 404
    assert bob_client.get(f"/sweeps/{sweep_id}/data.json").status_code == 404
    refused = sweep(bob_api, base_job)
    assert refused.status_code == 400 and refused.json()["base_job"] == ["Not one of your teams' jobs."]
