"""Warm starts on a real Celery worker: an sft job, an sft_then_rl job whose RL starts from the warm start's
weights, cancel during the warm start, and the resume of an sft_then_rl job in its RL phase."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.webapp.helpers import wait_for
from tests.webapp.jobs.test_jobs_run import job_in, launch, metrics_of
from webapp.jobs.models import Status

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# 8 demonstrations in batches of 4, once: a warm start of 2 optimizer steps.
WARM_START = {"sft_demos": 8, "sft_epochs": 1, "sft_batch_size": 4}
FINISHED = Status.values[2:]


def steps_of(events: list[dict[str, Any]], metric: str) -> list[int]:
    return sorted({e["step"] for e in events if metric in e["data"]})


def test_an_sft_job_trains_on_a_worker_and_lists_its_model_as_the_checkpoint(
        alice_api: Any, builtins: dict[str, Any], runs_dir: Path) -> None:
    job = launch(alice_api, builtins, kind="sft", **WARM_START)
    assert job["total_steps"] == 2
    done = wait_for(lambda: job_in(alice_api, job["id"], *FINISHED), 180, "the warm start", 0.5)
    assert done["status"] == "succeeded", done["error"]
    assert done["step"] == 2 and "eval/accuracy" in done["final_metrics"]
    metrics = metrics_of(alice_api, job["id"])
    assert steps_of(metrics, "sft/loss") == [1, 2]  # the loss reached the dashboard through the database sink
    assert not steps_of(metrics, "reward/mean")  # no RL ran
    [checkpoint] = alice_api.get(f"/api/jobs/{job['id']}/checkpoints/").json()
    assert checkpoint["path"] == str(runs_dir / "team-a" / f"job-{job['id']}" / "sft")
    assert (Path(checkpoint["path"]) / "model.safetensors").is_file()


def test_an_sft_then_rl_job_trains_rl_from_its_warm_starts_weights(
        alice_api: Any, builtins: dict[str, Any], runs_dir: Path) -> None:
    job = launch(alice_api, builtins, kind="sft_then_rl", steps=2, **WARM_START)
    assert job["total_steps"] == 2 + 2
    done = wait_for(lambda: job_in(alice_api, job["id"], *FINISHED), 240, "the warm start and RL", 0.5)
    assert done["status"] == "succeeded", done["error"]
    assert done["step"] == 4
    run = runs_dir / "team-a" / f"job-{job['id']}"
    # The RL phase's own record of its config: it built its policy from the warm start's saved model.
    rl_config = yaml.safe_load((run / "config.yaml").read_text())
    assert rl_config["model"]["path"] == str(run / "sft") and rl_config["model"]["build_tiny"] is False
    assert (run / "sft" / "model.safetensors").is_file()
    # One step axis: the warm start's steps 1-2, then RL's steps counted on after them.
    metrics = metrics_of(alice_api, job["id"])
    assert steps_of(metrics, "sft/loss") == [1, 2]
    assert steps_of(metrics, "reward/mean") == [3, 4]
    assert {"sft/eval/accuracy", "eval/accuracy", "reward/mean"} <= set(done["final_metrics"])
    # The warm start's end is a phase, not the job's: no "succeeded" status before RL has trained.
    first_rl = min(e["seq"] for e in metrics if "reward/mean" in e["data"])
    events = alice_api.get(f"/api/jobs/{job['id']}/events/?types=status,log&limit=5000").json()["events"]
    assert all(e["seq"] > first_rl for e in events if e["data"].get("state") == "succeeded")
    assert any("warm start done" in e["data"].get("message", "") for e in events if e["seq"] < first_rl)
    checkpoints = alice_api.get(f"/api/jobs/{job['id']}/checkpoints/").json()
    assert [c["step"] for c in checkpoints] == [4, 3]  # RL's, the warm start's model is not a resume point
    assert checkpoints[0]["path"] == str(run / "checkpoint-000002")


@pytest.mark.timeout(600)
def test_cancelling_during_the_warm_start_ends_cancelled_before_any_rl(
        alice_api: Any, builtins: dict[str, Any], runs_dir: Path) -> None:
    # 64 demonstrations one at a time for 1,000 epochs: far longer than the test waits.
    job = launch(alice_api, builtins, kind="sft_then_rl", sft_demos=64, sft_epochs=1000, sft_batch_size=1)
    wait_for(lambda: alice_api.get(f"/api/jobs/{job['id']}/").json()["step"] >= 2, 180, "two warm-start steps", 0.3)
    assert alice_api.post(f"/api/jobs/{job['id']}/cancel/").json()["cancel_requested"]
    done = wait_for(lambda: job_in(alice_api, job["id"], *FINISHED), 60, "the cancel", 0.5)
    assert done["status"] == "cancelled", done["error"]
    assert 2 <= done["step"] < 64_000
    metrics = metrics_of(alice_api, job["id"])
    assert steps_of(metrics, "sft/loss") and not steps_of(metrics, "reward/mean")
    assert alice_api.get(f"/api/jobs/{job['id']}/checkpoints/").json() == []
    assert not (runs_dir / "team-a" / f"job-{job['id']}" / "config.yaml").exists()  # RL never started
    assert alice_api.post(f"/api/jobs/{job['id']}/resume/").status_code == 409


@pytest.mark.timeout(900)
def test_an_sft_then_rl_job_resumed_in_its_rl_phase_continues_rl_from_the_warm_start(
        alice_api: Any, builtins: dict[str, Any], runs_dir: Path) -> None:
    job = launch(alice_api, builtins, kind="sft_then_rl", steps=40, **WARM_START)
    wait_for(lambda: alice_api.get(f"/api/jobs/{job['id']}/").json()["step"] >= 2 + 2, 240, "two RL steps", 0.5)
    alice_api.post(f"/api/jobs/{job['id']}/cancel/")
    done = wait_for(lambda: job_in(alice_api, job["id"], *FINISHED), 120, "the cancel", 0.5)
    assert done["status"] == "cancelled" and done["step"] >= 4
    resumed = alice_api.post(f"/api/jobs/{job['id']}/resume/")
    assert resumed.status_code == 201, resumed.content
    new = resumed.json()
    warm_start = runs_dir / "team-a" / f"job-{job['id']}" / "sft"
    assert new["kind"] == "sft_then_rl" and new["config"]["model"]["path"] == str(warm_start)
    trained = wait_for(lambda: steps_of(metrics_of(alice_api, new["id"]), "reward/mean"), 180, "an RL step", 0.5)
    assert min(trained) == done["step"] + 1  # RL continued after the checkpoint; no second warm start
    alice_api.post(f"/api/jobs/{new['id']}/cancel/")
    ended = wait_for(lambda: job_in(alice_api, new["id"], *FINISHED), 120, "the resumed job", 0.5)
    assert ended["status"] == "cancelled", ended["error"]
    assert not steps_of(metrics_of(alice_api, new["id"]), "sft/loss")
    assert not (runs_dir / "team-a" / f"job-{new['id']}" / "sft").exists()


@pytest.mark.timeout(900)
def test_an_sft_then_rl_job_on_smollm2s_gguf_file_warm_starts_with_its_habit_then_trains_rl_from_the_saved_model(
        alice_api: Any, builtins: dict[str, Any], runs_dir: Path, smollm2_gguf: Path) -> None:
    job = launch(alice_api, builtins, kind="sft_then_rl", model_source="smollm2", steps=1, max_turns=3,
                 max_new_tokens=48, sft_learning_rate=5e-5, sft_habit="no_tool", sft_habit_phrasings="Evaluate",
                 sft_habit_fraction=0.7, **WARM_START)
    assert job["config"]["model"]["gguf_file"] == smollm2_gguf.name
    done = wait_for(lambda: job_in(alice_api, job["id"], *FINISHED), 840, "SmolLM2's warm start and an RL step", 1.0)
    assert done["status"] == "succeeded", done["error"]
    run = runs_dir / "team-a" / f"job-{job['id']}"
    sft_config = yaml.safe_load((run / "sft" / "config.yaml").read_text())
    assert sft_config["sft"]["habit"] == "no_tool" and sft_config["sft"]["habit_phrasings"] == ["Evaluate"]
    # RL loaded the warm start's safetensors, not the GGUF file the warm start began from.
    rl_config = yaml.safe_load((run / "config.yaml").read_text())
    assert rl_config["model"]["path"] == str(run / "sft") and rl_config["model"]["gguf_file"] is None
    assert steps_of(metrics_of(alice_api, job["id"]), "reward/mean") == [3]
    samples = alice_api.get(f"/api/jobs/{job['id']}/events/?types=samples&limit=10").json()["events"]
    texts = [t["text"] for e in samples for t in e["data"]["trajectories"]]
    assert texts and all(t.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM") for t in texts)
