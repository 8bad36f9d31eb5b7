"""Every example config loads, and the retrieval example's SFT and GRPO run on the tiny model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from trainer.config import ConfigError, load_config
from trainer.events import read_events

ROOT = Path(__file__).parents[3]
EXAMPLES = sorted((ROOT / "examples").glob("*/*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[f"{p.parent.name}/{p.name}" for p in EXAMPLES])
def test_every_example_config_loads_and_validates(path: Path) -> None:
    config = load_config(path)
    assert config.rollout.tools and config.data.task


def test_the_built_in_tasks_keep_train_and_test_apart() -> None:
    from trainer.builders import load_samples

    for task in ("arithmetic", "key_chain", "wiki_qa", "scienceworld"):
        train, test = load_samples(load_config(None, [f"data.task={task}", "data.train_size=200"]))
        assert train and test
        assert not {s["id"] for s in train} & {s["id"] for s in test}, task


def test_sft_demonstrations_for_a_task_without_a_generator_are_refused() -> None:
    from trainer.sft import demonstration_conversations

    with pytest.raises(ConfigError, match="'key_chain' and 'wiki_qa'"):
        demonstration_conversations(load_config(None, ["data.task=scienceworld"]))


def test_written_sft_demonstrations_are_used_as_they_are_and_never_given_deliberate_flaws(tmp_path: Path) -> None:
    from trainer.sft import demonstration_conversations

    demos = tmp_path / "demos.jsonl"
    row = {"sample": {"id": "a", "prompt": "Go."}, "messages": [{"role": "user", "content": "Go."},
                                                              {"role": "assistant", "content": "Done."}]}
    demos.write_text(json.dumps(row) + "\n" + json.dumps({"sample": {"id": "b"}}) + "\n")
    # The default wrong_fraction (0.25) is for generated demonstrations: written ones stay as written.
    config = load_config(None, [f"sft.demos_path={demos}", "sft.num_demos=1"])
    assert demonstration_conversations(config) == [(row["sample"], row["messages"])]
    with pytest.raises(ConfigError, match="demonstration 2 needs a 'question' \\(or 'prompt'\\) and 'messages'"):
        demonstration_conversations(load_config(None, [f"sft.demos_path={demos}"]))


@pytest.mark.slow
@pytest.mark.timeout(900)  # two runs of the CLI, each allowed 300 s
def test_the_retrieval_example_warm_starts_and_trains_on_the_tiny_model(tiny_model_dir: Path, tmp_path: Path,
                                                                        agentfly: Any, tiny_overrides: Any) -> None:
    sft = tmp_path / "sft"
    proc = agentfly("sft", str(ROOT / "examples/retrieval_qa/sft.yaml"), *[a for s in [
        f"model.path={tiny_model_dir}", "model.build_tiny=false", f"sft.output_dir={sft}", "sft.num_demos=16",
        "data.eval_size=4", "threads=1"] for a in ("--set", s)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    demos = read_events(sft / "events.jsonl", "metrics")[-1]["data"]
    assert demos["sft/demonstrations"] == 16 and "eval/accuracy" in demos
    sets = tiny_overrides(sft, tmp_path / "grpo", "model.build_tiny=false", "rollout.max_new_tokens=24")
    proc = agentfly("train", str(ROOT / "examples/retrieval_qa/grpo.yaml"), *[a for s in sets for a in ("--set", s)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["step"] == 2
    pools = [e["data"].get("pools", {}) for e in read_events(tmp_path / "grpo" / "events.jsonl", "resources")]
    assert any("wiki" in p for p in pools)


def test_retrieval_demonstrations_run_the_real_search_and_train_only_the_assistant(tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    from trainer.sft import demonstration_conversations, demonstration_trajectories

    config = load_config(ROOT / "examples/retrieval_qa/sft.yaml", [f"model.path={tiny_model_dir}",
                                                                   "sft.num_demos=4", "sft.wrong_fraction=0"])
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    pairs = demonstration_conversations(config)
    for (sample, messages), t in zip(pairs, demonstration_trajectories(config, tokenizer), strict=True):
        assert t.tool_calls[0].name == "search" and t.tool_calls[0].error is None
        assert sample["answer"].split()[0] in t.tool_calls[0].observation  # the passage with the answer was found
        assert t.final_answer == f"<answer>{sample['answer']}</answer>" and t.reward == 1.0
        trained = tokenizer.decode([i for i, m in zip(t.token_ids, t.loss_mask, strict=True) if m])
        assert trained == "".join(m["content"] + "<|im_end|>" for m in messages if m["role"] == "assistant")
