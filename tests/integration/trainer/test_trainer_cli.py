"""The real ``agentfly`` entry point, two steps on the tiny model, for every algorithm and option family."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.events import read_events

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from trainer_runs import tiny_overrides  # noqa: E402

pytestmark = pytest.mark.slow


def agentfly(*args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).parent / "agentfly"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "trainer.cli"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=timeout, env=env)


CASES = [
    ("grpo", []),
    ("grpo", ["algorithm.kl_coef=0.05", "algorithm.entropy_coef=0.01"]),
    ("dr_grpo", []),
    ("dapo", ["algorithm.overlong_buffer=4", "algorithm.overlong_max_tokens=8", "algorithm.max_sample_batches=2"]),
    ("rloo", ["algorithm.minibatches=2"]),
    ("reinforce_pp", ["algorithm.kl_coef=0.05", "algorithm.kl_in_reward=true", "algorithm.kl_estimator=k1"]),
    ("reinforce_pp_baseline", []),
    ("ppo", ["algorithm.epochs=2", "algorithm.minibatches=2"]),
]


@pytest.mark.parametrize(("algorithm", "extra"), CASES, ids=[f"{a}-{i}" for i, (a, _) in enumerate(CASES)])
def test_train_runs_two_steps_and_writes_events_and_a_checkpoint(tiny_model_dir, tmp_path, algorithm, extra):
    out = tmp_path / "run"
    sets = tiny_overrides(tiny_model_dir, out, f"algorithm.name={algorithm}",
                          "rollout.reward=rewards_for_tests:answer_length", *extra)
    proc = agentfly("train", *[a for s in sets for a in ("--set", s)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["step"] == 2 and result["state"] == "succeeded"
    metrics = [e for e in read_events(out / "events.jsonl", "metrics") if "time/rollout" in e["data"]]
    assert [e["step"] for e in metrics] == [1, 2]
    for stage in ("rollout", "reward", "update", "weight_sync"):
        assert f"time/{stage}" in metrics[0]["data"]
    trained = [e for e in metrics if "update/skipped" not in e["data"]]
    assert trained, "no step trained (every group was dropped)"
    assert "loss/policy" in trained[0]["data"] and "logprob_mismatch" in trained[0]["data"]
    assert read_events(out / "events.jsonl", "samples")[0]["data"]["trajectories"][0]["segments"]
    ckpt = Path(result["checkpoint"])
    assert (ckpt / "model.safetensors").exists() and (ckpt / "trainer_state.pt").exists()


def test_eval_reports_greedy_accuracy_of_a_checkpoint(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    sets = tiny_overrides(tiny_model_dir, out, "steps=1")
    assert agentfly("train", *[a for s in sets for a in ("--set", s)]).returncode == 0
    proc = agentfly("eval", str(out / "checkpoint-latest"), "--split", "test", "--n", "3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["n"] == 3 and 0.0 <= result["eval/accuracy"] <= 1.0


def test_a_bad_key_exits_with_status_2_and_names_the_fix(tmp_path):
    proc = agentfly("train", "--set", "algorithm.nme=rloo", "--set", f"output_dir={tmp_path}")
    assert proc.returncode == 2
    assert "did you mean 'algorithm.name'" in proc.stderr


def test_demo_prints_trajectories_with_their_mask(tiny_model_dir):
    proc = agentfly("demo", "--model", str(tiny_model_dir), "--n", "1", "--max-new-tokens", "8")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "reward=" in proc.stdout and "[[" in proc.stdout  # trained spans are bracketed without colour


@pytest.mark.vllm
@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_train_with_the_vllm_engine_runs_two_steps_and_reports_the_logprob_mismatch(tiny_model_dir, tmp_path,
                                                                                     algorithm):
    pytest.importorskip("vllm")
    out = tmp_path / "run"
    sets = tiny_overrides(tiny_model_dir, out, f"algorithm.name={algorithm}", "engine=vllm",
                          "rollout.reward=rewards_for_tests:answer_length", "algorithm.minibatches=2")
    proc = agentfly("train", *[a for s in sets for a in ("--set", s)], timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = [e["data"] for e in read_events(out / "events.jsonl", "metrics") if "time/rollout" in e["data"]]
    assert len(metrics) == 2
    # vLLM samples with its own kernels; after each weight sync its logprobs must stay close to the trainer's.
    assert all(m["logprob_mismatch"] < 0.05 for m in metrics if "logprob_mismatch" in m)
