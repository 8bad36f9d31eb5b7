"""SFT demonstrations for the ScienceWorld agent from the simulator's own gold action sequences.

For each chosen task and variation, a live simulator (the same ``ScienceWorld`` resource the rollouts use)
gives its gold actions; each becomes one ``sciworld_act`` tool call in the Hermes format, and the tool
itself runs it, so the conversation holds the exact observations a rollout sees (intro, room views, score
lines). The conversation ends with a plain answer once the task is complete.

Train demonstrations come from ScienceWorld's train variations; the held-out samples from its test
variations, which never appear in a demonstration. Written to ``OUT``:

    demos.jsonl   {"sample": {...}, "messages": [...]} a line        (sft.demos_path)
    train.jsonl   the demonstrated samples, for GRPO after the warm start (data.task)
    test.jsonl    held-out samples on unseen test variations           (data.eval_path)

    python examples/scienceworld/make_demos.py runs/scienceworld/demos --per-task 20 --held-out 5 \
        --base runs/scienceworld/base

``--base`` also writes the model the SFT starts from: the calculator warm start (the tiny model, which
already writes Hermes tool calls), with its context raised from 1,024 to 4,096 tokens, since a gold
episode with its room views is 1,000 to 3,000 tokens. Its positions are rotary, so nothing is resized; a
model trained from scratch instead needs far more SFT steps than one loaded CPU core gives in minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from agentfly.envs.scienceworld import PROMPT, ScienceWorld
from agentfly.tools.builtin.scienceworld import sciworld_act

# Short gold paths (3 to 16 actions) whose every step is a move, a look, a focus or a pick-up.
TASKS = ("find-non-living-thing", "find-living-thing", "find-animal", "find-plant")
DONE = "The task is complete."


class DemoContext:
    """The slice of a rollout's context the ScienceWorld tools use: the sample, its info, its simulator."""

    def __init__(self, sample: dict[str, Any], env: ScienceWorld) -> None:
        self.sample, self.info, self._env = sample, {}, env

    async def resource(self, name: str) -> ScienceWorld:
        return self._env


def tool_call(action: str) -> str:
    """The assistant turn that calls ``sciworld_act`` (the Hermes format the agent's parser reads)."""
    return "<tool_call>\n" + json.dumps({"name": "sciworld_act", "arguments": {"action": action}}) + "\n</tool_call>"


def sample_of(task: str, variation: int, split: str, description: str) -> dict[str, Any]:
    return {"id": f"{task}/{variation}", "task": task, "variation": variation, "split": split,
            "prompt": PROMPT.format(description=description)}


async def demonstration(env: ScienceWorld, task: str, variation: int, max_actions: int = 12) -> dict[str, Any] | None:
    """The gold conversation of one train variation, or None if its gold path is longer than ``max_actions``
    or does not complete the task."""
    actions, description = await env.gold_actions(task, variation)
    if len(actions) > max_actions:
        return None
    sample = sample_of(task, variation, "train", description)
    context = DemoContext(sample, env)
    messages: list[dict[str, Any]] = [{"role": "user", "content": sample["prompt"]}]
    # The tool's first call loads the episode and shows its intro, as in a rollout.
    for action in actions:
        observation = await sciworld_act.fn(action, context)
        messages += [{"role": "assistant", "content": tool_call(action)},
                     {"role": "tool", "name": "sciworld_act", "content": observation}]
    if env.score < 100:
        return None
    messages.append({"role": "assistant", "content": DONE})
    return {"sample": sample, "messages": messages, "gold_actions": actions}


async def build(out: Path, tasks: list[str], per_task: int, held_out: int, max_actions: int) -> dict[str, int]:
    from agentfly.envs.scienceworld import task_index

    index = task_index()["tasks"]
    env = ScienceWorld()
    await env.start()
    demos, tests = [], []
    try:
        for task in tasks:
            kept = 0
            for variation in index[task]["train"]:
                if kept == per_task:
                    break
                demo = await demonstration(env, task, variation, max_actions)
                if demo is not None:
                    demos.append(demo)
                    kept += 1
            for variation in index[task]["test"][:held_out]:
                _, description = await env.gold_actions(task, variation)  # its description; the actions unused
                tests.append(sample_of(task, variation, "test", description))
            print(f"{task}: {kept} demonstrations, {min(held_out, len(index[task]['test']))} held-out", file=sys.stderr)
    finally:
        await env.close()
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in (("demos", demos), ("train", [d["sample"] for d in demos]), ("test", tests)):
        (out / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {"demos": len(demos), "test": len(tests)}


CALCULATOR = Path(__file__).parents[1] / "calculator" / "warm_start"


def base_model(out: Path, context: int = 4096) -> Path:
    """The calculator warm start in ``out`` with a ``context``-token window (model and tokenizer)."""
    shutil.copytree(CALCULATOR, out, dirs_exist_ok=True, ignore=shutil.ignore_patterns("README.md", "*.yaml"))
    for name, key in (("config.json", "max_position_embeddings"), ("tokenizer_config.json", "model_max_length")):
        settings = json.loads((out / name).read_text())
        settings[key] = context
        (out / name).write_text(json.dumps(settings, indent=2) + "\n")
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, help="output folder (demos.jsonl, train.jsonl, test.jsonl)")
    ap.add_argument("--tasks", nargs="+", default=list(TASKS), help="ScienceWorld task names")
    ap.add_argument("--per-task", type=int, default=20, help="train demonstrations per task")
    ap.add_argument("--held-out", type=int, default=5, help="held-out test variations per task")
    ap.add_argument("--max-actions", type=int, default=12, help="skip variations with longer gold paths")
    ap.add_argument("--base", type=Path, help="also write the SFT's starting model here (see above)")
    args = ap.parse_args(argv)
    if args.base:
        print(f"wrote the starting model to {base_model(args.base)}")
    counts = asyncio.run(build(args.out, args.tasks, args.per_task, args.held_out, args.max_actions))
    print(f"wrote {counts['demos']} demonstrations and {counts['test']} held-out samples to {args.out}")


if __name__ == "__main__":
    main()
