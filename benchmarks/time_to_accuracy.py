"""Time to accuracy: the training seconds an AgentFly run needed to reach a held-out accuracy, read from its
saved checkpoints and its events.

    python benchmarks/time_to_accuracy.py runs/calculator/grpo-async-seed0 --target 0.85

Each ``checkpoint-N`` of the run is scored in step order (the calculator example's held-out problems, 500,
greedy, AgentFly's evaluator: what ``agentfly eval --split test`` runs) until one reaches ``--target``. The
training seconds at a checkpoint are wall time since training began, less the time checkpoints and evals
took (from the run's ``events.jsonl``), so saving often costs the run nothing. The last line is JSON:
``{"run", "target", "reached_seconds", "reached_step", "curve": [[step, seconds, accuracy], ...]}``.

    python benchmarks/time_to_accuracy.py runs/smollm2_tools/grpo-seed0 --target 0.755 --from-events

``--from-events`` scores nothing: it reads the run's periodic held-out evaluations (``eval.every``) from its
events, for a run that evaluated as it trained (any task), with the training seconds counted the same way.
``benchmarks/trl_compare.py --learning`` uses the same functions for every side.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "calculator" / "grpo.yaml"


def checkpoint_times(run_dir: Path, trajectories_per_step: int) -> tuple[list[dict[str, Any]], float, int, int]:
    """The run's saves ``[{step, seconds, path, trained_tokens}]`` in step order, and its totals: training
    seconds, trained (sampled) tokens and steps."""
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines() if line.strip()]
    begin = next(e["time"] for e in events if e["type"] == "status" and "training from step" in e["data"].get(
        "message", ""))
    paused, tokens = 0.0, 0
    trained_at: dict[int, float] = {}
    tokens_at: dict[int, int] = {}
    for e in events:
        data = e["data"]
        if e["type"] != "metrics":
            continue
        if "time/step" in data:
            tokens += round(data.get("response_length/mean", 0.0) * trajectories_per_step)
            trained_at[e["step"]] = e["time"] - begin - paused
            tokens_at[e["step"]] = tokens
        paused += data.get("time/checkpoint", 0.0) + data.get("time/eval", 0.0)
    saves = []
    for ckpt in sorted(run_dir.glob("checkpoint-[0-9]*"), key=lambda p: int(p.name.split("-")[1])):
        step = int(ckpt.name.split("-")[1])
        if step in trained_at:
            saves.append({"step": step, "seconds": trained_at[step], "path": str(ckpt),
                          "trained_tokens": tokens_at[step]})
    last = max(trained_at)
    return saves, trained_at[last], tokens_at[last], last


def eval_curve(run_dir: Path) -> list[tuple[int, float, float]]:
    """``(step, training seconds, accuracy)`` of each periodic held-out evaluation of a run, from its events.
    The seconds are wall time since training began less the evaluations and saves before that point (and the
    evaluation itself); the final evaluation, which repeats the last periodic one's step, is left out."""
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines() if line.strip()]
    begin = next(e["time"] for e in events if e["type"] == "status"
                 and "training from step" in e["data"].get("message", ""))
    paused, out = 0.0, []
    for e in events:
        if e["type"] != "metrics":
            continue
        data = e["data"]
        if "eval/accuracy" in data and not (out and out[-1][0] == e["step"]):
            out.append((e["step"], e["time"] - begin - paused - data.get("time/eval", 0.0), data["eval/accuracy"]))
        paused += data.get("time/checkpoint", 0.0) + data.get("time/eval", 0.0)
    return out


def held_out_accuracy(checkpoint: str, test: Path | None, n: int, example: Path = EXAMPLE) -> float:
    """Greedy accuracy on the held-out problems (``test``, or the calculator example's test split), with
    AgentFly's evaluator (``agentfly eval``'s path) under ``example``'s settings (tools, parser, budgets)."""
    import torch

    from agentfly.engines.hf import HFEngine
    from agentfly.tasks import arithmetic
    from agentfly.tasks.io import load_jsonl
    from trainer.builders import build_agent, load_policy, setup_torch
    from trainer.config import load_config
    from trainer.evaluation import evaluate

    overrides = [f"model.path={checkpoint}", f"data.eval_size={n}", "threads=2"]
    if test is not None:
        overrides.append(f"data.eval_path={test}")
    config = load_config(str(example), overrides)
    samples = load_jsonl(test)[:n] if test is not None else arithmetic.generate(n, seed=config.data.seed, split="test")
    model, tokenizer = load_policy(config, setup_torch(config), path=checkpoint)
    model.eval()
    agent = build_agent(config, HFEngine(model=model, tokenizer=tokenizer))
    with torch.inference_mode():
        metrics, _ = evaluate(agent, samples, config.eval.max_new_tokens, config.eval.batch_size)
    return float(metrics["eval/accuracy"])


def time_to_target(side: dict[str, Any], test: Path | None, n: int, target: float, example: Path = EXAMPLE) -> None:
    """Scores the side's saves in order until one reaches ``target``, then its last save; fills in
    ``reached`` (training seconds at the first save at or above the target, or None) and ``final``."""
    side["reached"], side["reached_step"], side["curve"] = None, None, []
    saves = side["saves"]
    for i, save in enumerate(saves):
        if side["reached"] is not None and i != len(saves) - 1:
            continue
        acc = held_out_accuracy(save["path"], test, n, example)
        side["curve"].append((save["step"], round(save["seconds"], 1), acc))
        print(f"  {side['framework']}: step {save['step']} at {save['seconds']:.0f} s: {acc:.3f}", file=sys.stderr,
              flush=True)
        if side["reached"] is None and acc >= target:
            side["reached"], side["reached_step"] = save["seconds"], save["step"]
    side["final"] = side["curve"][-1][2] if side["curve"] else float("nan")


# run_all skips this tool: it reads the saved checkpoints and events of a run another command made.
READS_A_RUN = True


def main(argv: list[str] | None = None) -> float | None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", help="an agentfly train output_dir with checkpoint-N folders and events.jsonl")
    ap.add_argument("--target", type=float, default=0.85, help="held-out accuracy to reach")
    ap.add_argument("--n", type=int, default=500, help="held-out problems")
    ap.add_argument("--from-events", action="store_true",
                    help="read the run's periodic evaluations (eval.every) instead of scoring its checkpoints")
    args = ap.parse_args(argv)
    run = Path(args.run)
    saves, seconds, _, steps = checkpoint_times(run, 1)
    side: dict[str, Any] = {"framework": run.name, "saves": saves}
    if args.from_events:
        side["curve"] = [(step, round(t, 1), acc) for step, t, acc in eval_curve(run)]
        first = next(((t, step) for step, t, acc in side["curve"] if acc >= args.target), (None, None))
        side["reached"], side["reached_step"] = first
        side["final"] = side["curve"][-1][2] if side["curve"] else float("nan")
    else:
        time_to_target(side, None, args.n, args.target)
    reached = side["reached"]
    print(f"{run.name}: {steps} steps in {seconds:.0f} s of training; " + (
        f"held-out {args.target:.0%} reached at step {side['reached_step']}, after {reached:.0f} s"
        if reached is not None else f"held-out {args.target:.0%} not reached (last save: {side['final']:.3f})"))
    print(json.dumps({"run": str(run), "target": args.target, "reached_seconds": reached,
                      "reached_step": side["reached_step"], "train_seconds": seconds, "steps": steps,
                      "curve": side["curve"]}))
    return reached


if __name__ == "__main__":
    main()
