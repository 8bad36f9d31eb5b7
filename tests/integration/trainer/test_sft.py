"""``agentfly sft``: the supervised warm start through the real entry point on the tiny model."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from trainer.events import read_events

pytestmark = pytest.mark.slow


@pytest.mark.timeout(900)  # two runs of the CLI, each allowed 300 s
def test_sft_lowers_the_loss_saves_a_loadable_model_and_evaluates_it(tiny_model_dir: Path, tmp_path: Path,
                                                                     agentfly: Any) -> None:
    out = tmp_path / "sft"
    sets = [f"model.path={tiny_model_dir}", f"output_dir={tmp_path}", f"sft.output_dir={out}", "threads=1",
            "sft.num_demos=48", "sft.epochs=4", "sft.batch_size=8", "sft.lr=0.003", "sft.warmup_steps=2",
            "sft.schedule=cosine", "sft.habit_phrasings=[Evaluate]", "sft.habit_fraction=0.5", "data.eval_size=6", "eval.max_new_tokens=40"]
    proc = agentfly("sft", *[a for s in sets for a in ("--set", s)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    losses = [e["data"]["sft/loss"] for e in read_events(out / "events.jsonl", "metrics") if "sft/loss" in e["data"]]
    assert len(losses) == 4 * 48 // 8
    assert sum(losses[-6:]) / 6 < 0.5 * sum(losses[:6]) / 6
    # Warm-up over 2 steps, then a cosine decay over all 24 optimizer steps of the 4 epochs.
    lrs = [e["data"]["lr"] for e in read_events(out / "events.jsonl", "metrics") if "sft/loss" in e["data"]]
    assert lrs[:3] == pytest.approx([0.0015, 0.003, 0.003])
    assert all(a > b for a, b in itertools.pairwise(lrs[2:])) and lrs[-1] < 0.0001
    final = read_events(out / "events.jsonl", "metrics")[-1]["data"]
    assert final["sft/demonstrations"] == 48 and final["eval/rollout_errors"] == 0.0
    # The accuracy is the share of full rewards, which math_equal (0 or 1) makes the mean reward.
    assert final["eval/accuracy"] == final["eval/reward/mean"]
    assert read_events(out / "events.jsonl", "status")[-1]["data"]["state"] == "succeeded"
    # The saved model is an ordinary Hugging Face directory that `agentfly eval` can load, and it is the model
    # the run evaluated: greedy decoding of the same 6 held-out problems reproduces the run's own eval.
    proc = agentfly("eval", str(out), "--n", "6", "--set", "eval.max_new_tokens=40", "--set", "threads=1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["n"] == 6
    evaluated = {k: v for k, v in final.items() if k.startswith("eval/")}
    assert {k: result[k] for k in evaluated} == pytest.approx(evaluated)


def test_sft_trains_exactly_the_assistant_tokens(tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    from trainer.config import load_config
    from trainer.sft import demonstration_conversations, demonstration_trajectories

    config = load_config(None, [f"model.path={tiny_model_dir}", "sft.num_demos=6",
                                "sft.habit_phrasings=[What, Compute]", "sft.habit_fraction=0.5"])
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    trajectories = demonstration_trajectories(config, tokenizer)
    for (_, messages), t in zip(demonstration_conversations(config), trajectories, strict=True):
        trained = tokenizer.decode([i for i, m in zip(t.token_ids, t.loss_mask, strict=True) if m])
        assert trained == "".join(m["content"] + "<|im_end|>" for m in messages if m["role"] == "assistant")


def test_written_demonstrations_replay_with_the_assistant_tokens_trained(tiny_model_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from agentfly.tasks import arithmetic
    from trainer.config import load_config
    from trainer.sft import demonstration_trajectories

    samples = arithmetic.generate(3, seed=5, split="sft")
    written = [arithmetic.demonstration(samples[0]), arithmetic.demonstration(samples[1], use_tool=False,
                                                                              answer="I think 7"),
               arithmetic.demonstration(samples[2])]
    path = tmp_path / "demos.jsonl"
    path.write_text("".join(json.dumps({**s, "messages": m}) + "\n" for s, m in zip(samples, written, strict=True)))
    config = load_config(None, [f"model.path={tiny_model_dir}", f"sft.demos_path={path}", "data.task=any.jsonl"])
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    for messages, t in zip(written, demonstration_trajectories(config, tokenizer), strict=True):
        trained = tokenizer.decode([i for i, m in zip(t.token_ids, t.loss_mask, strict=True) if m])
        assert trained == "".join(m["content"] + "<|im_end|>" for m in messages if m["role"] == "assistant")
