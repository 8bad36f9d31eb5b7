"""The real ``agentfly`` entry point, two steps on the tiny model, for every algorithm and option family."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer.events import read_events

pytestmark = pytest.mark.slow


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
def test_train_runs_two_steps_and_writes_events_and_a_checkpoint(tiny_model_dir, tmp_path, algorithm, extra,
                                                                agentfly, tiny_overrides):
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


@pytest.mark.timeout(900)  # two runs of the CLI, each allowed 300 s
def test_eval_reports_pass_at_1_pass_at_k_turns_and_tool_errors_per_split_as_a_table_and_json(
        tiny_model_dir, tmp_path, agentfly, tiny_overrides):
    out = tmp_path / "run"
    sets = tiny_overrides(tiny_model_dir, out, "steps=1")
    assert agentfly("train", *[a for s in sets for a in ("--set", s)]).returncode == 0
    held_out = tmp_path / "held_out.jsonl"
    held_out.write_text("".join(json.dumps({"id": f"h{i}", "question": q, "answer": a, "type": kind}) + "\n"
                                for i, (q, a, kind) in enumerate([("What is 2+3?", "5", "add"),
                                                                   ("What is 4*5?", "20", "mul"),
                                                                   ("What is 7+8?", "15", "add")])))
    report = tmp_path / "eval.json"
    proc = agentfly("eval", str(out / "checkpoint-latest"), "--split", "test", "--n", "3", "--k", "1", "2",
                    "--samples", "3", "--temperature", "1.0", "--json", str(report),
                    "--set", f"data.eval_path={held_out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    result = json.loads(lines[-1])
    assert result == json.loads(report.read_text())
    assert result["n"] == 3 and result["eval/rollout_errors"] == 0.0
    # Every greedy answer is cut at eval.max_new_tokens=8, before any final answer, so none can be right; the
    # accuracy is the share of full rewards, which math_equal (0 or 1) makes the mean reward.
    assert result["eval/finish/length"] == 1.0
    assert result["eval/accuracy"] == result["eval/reward/mean"] == result["eval/pass_at_1"] == 0.0
    assert result["eval/sampled/pass_at_1"] == result["eval/sampled/pass_at_2"] == 0.0
    assert (result["eval/sampled/n"], result["eval/sampled/temperature"]) == (3, 1.0)
    assert result["eval/mean_turns"] == 1.0  # cut in its first turn
    assert 0.0 <= result["eval/tool_error_rate"] <= 1.0
    # The samples' "type" field makes the splits.
    assert result["group_by"] == "field 'type'"
    assert {k: v["eval/problems"] for k, v in result["splits"].items()} == {"add": 2, "mul": 1}
    header, rule, *rows = lines[: lines.index("splits by field 'type'")]
    for column in ("pass@1 (greedy)", "pass@1 (n=3, T=1)", "pass@2 (n=3, T=1)", "mean turns", "tool-error rate"):
        assert column in header
    assert set(rule) == {"-", " "}
    assert [r.split()[:2] for r in rows] == [["all", "3"], ["add", "2"], ["mul", "1"]]
    assert rows[0].split()[2:6] == ["0.000", "0.000", "0.000", "1.00"]


def test_a_bad_key_exits_with_status_2_and_names_the_fix(tmp_path, agentfly):
    proc = agentfly("train", "--set", "algorithm.nme=rloo", "--set", f"output_dir={tmp_path}")
    assert proc.returncode == 2
    assert "did you mean 'algorithm.name'" in proc.stderr


def test_demo_prints_trajectories_with_their_mask(tiny_model_dir, agentfly):
    proc = agentfly("demo", "--model", str(tiny_model_dir), "--n", "1", "--max-new-tokens", "8")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "reward=" in proc.stdout and "[[" in proc.stdout  # trained spans are bracketed without colour


@pytest.mark.vllm
@pytest.mark.timeout(1200)  # the run alone is allowed 900 s
@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_train_with_the_vllm_engine_runs_two_steps_and_reports_the_logprob_mismatch(tiny_model_dir, tmp_path,
                                                                                     algorithm, agentfly,
                                                                                     tiny_overrides):
    pytest.importorskip("vllm")
    out = tmp_path / "run"
    sets = tiny_overrides(tiny_model_dir, out, f"algorithm.name={algorithm}", "engine=vllm",
                          "rollout.reward=rewards_for_tests:answer_length", "algorithm.minibatches=2")
    proc = agentfly("train", *[a for s in sets for a in ("--set", s)], timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = [e["data"] for e in read_events(out / "events.jsonl", "metrics") if "time/rollout" in e["data"]]
    assert len(metrics) == 2
    trained = [m for m in metrics if "update/skipped" not in m]
    assert trained, "no step trained (every group was dropped), so no logprob was compared"
    # vLLM samples with its own kernels; after each weight sync its logprobs must stay close to the trainer's.
    # Every trained step reports the mismatch (a missing key fails here, it is not skipped).
    assert {m["step"]: m["logprob_mismatch"] < 0.05 for m in trained} == {m["step"]: True for m in trained}, trained


def test_a_run_prints_no_third_party_notice_on_stderr(tiny_model_dir, tmp_path, agentfly, tiny_overrides):
    # The default reward (math_equal, through math-verify) and a checkpoint save (which wakes DeepSpeed on a
    # machine without a GPU) are what printed them.
    sets = tiny_overrides(tiny_model_dir, tmp_path / "run", "steps=1")
    proc = agentfly("train", *[a for s in sets for a in ("--set", s)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    for notice in ("Timeout is disabled", "Setting accelerator", "Warning:", "[WARNING]"):
        assert notice not in proc.stderr, proc.stderr[-3000:]
