"""Asynchronous training: steps per second with ``rollout.mode=async`` (``max_staleness=1``) against sync, same
config, in one run; then the prefill tokens (and time) KV reuse across turns saves on a 4-turn task.

    python benchmarks/async_overlap.py                  # the calculator example's shape: 16 prompts x 8, 3 turns
    python benchmarks/async_overlap.py --quick          # a correctness run of a minute: 4 x 4, few steps
    python benchmarks/async_overlap.py --model examples/calculator/warm_start

Part 1. The same config (``examples/calculator/grpo.yaml``'s rollout, algorithm and optimizer, one torch
thread per side) trains ``--steps`` steps in sync mode, then in async mode, alternating ``--repeats`` times so
a change in machine load falls on both. Steps per second are taken between the first and last step's events
(the model load, the first step's warm-up and the final eval and checkpoint are outside). In sync mode a step
is rollout then update on one core; in async mode a producer thread generates the next batch on the other
core while the update runs. The line ``async/sync steps per second`` is the ratio (target >= 1.5 on a quiet
2-core machine).

Part 2 runs ``benchmarks/rollout_async.py --kv-reuse --turns 3`` (4 model turns, 3 tool calls, tools that
return at once): the HF engine keeping each turn's KV for the next against re-prefilling the conversation.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any


def overrides(args: argparse.Namespace, model: str, out: Path, mode: str) -> list[str]:
    quick = args.quick
    return [
        f"model.path={model}",
        "model.build_tiny=false",
        f"output_dir={out}",
        f"steps={args.steps}",
        "threads=1",
        "update_threads=1",
        "progress=false",
        "log_samples=0",
        f"rollout.mode={mode}",
        "rollout.max_staleness=1",
        "rollout.max_turns=3",
        f"rollout.prompts_per_step={4 if quick else 16}",
        f"rollout.group_size={4 if quick else 8}",
        "rollout.temperature=0.7",
        f"rollout.max_new_tokens={16 if quick else 48}",
        "algorithm.name=grpo",
        "algorithm.loss_agg=token-mean",
        "optim.lr=0.0001",
        "optim.grad_clip=1.0",
        "data.train_size=2000",
        "data.eval_size=1",
        "eval.max_new_tokens=8",
        "save_every=0",
    ]


def steps_per_second(
    args: argparse.Namespace, model: str, out: Path, mode: str
) -> tuple[float, dict[str, float]]:
    """Steps per second between the first and the last step, and the mean of a few per-step metrics."""
    from trainer.config import load_config
    from trainer.events import CallbackSink
    from trainer.loop import Trainer

    stamps: list[float] = []
    rows: list[dict[str, Any]] = []

    def on_event(event: dict[str, Any]) -> None:
        if event["type"] == "metrics" and "time/step" in event["data"]:
            stamps.append(time.perf_counter())
            rows.append(event["data"])

    Trainer(load_config(None, overrides(args, model, out, mode)), sinks=[CallbackSink(on_event)]).train()
    keys = (
        "time/step",
        "time/rollout",
        "time/update",
        "time/wait_for_batch",
        "time/producer_idle",
        "rollout/staleness_mean",
        "off_policy/weight_mean",
        "off_policy/truncated_fraction",
    )
    means = {k: statistics.mean(r[k] for r in rows[1:]) for k in keys if all(k in r for r in rows[1:])}
    return (len(stamps) - 1) / (stamps[-1] - stamps[0]), means


def main(argv: list[str] | None = None) -> float:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="4 prompts x 4, 16 tokens a turn, 4 steps, 1 repeat")
    ap.add_argument("--steps", type=int, default=None, help="training steps per run (default 8; --quick 4)")
    ap.add_argument("--repeats", type=int, default=None, help="sync/async pairs; the fastest of each counts")
    ap.add_argument("--model", default=None, help="model dir (default: build the tiny model in a temp dir)")
    ap.add_argument("--no-kv", action="store_true", help="skip part 2 (KV reuse across turns)")
    args = ap.parse_args(argv)
    args.steps = args.steps or (4 if args.quick else 8)
    args.repeats = args.repeats or (1 if args.quick else 2)

    import torch

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            from agentfly.models import build_tiny

            model = str(build_tiny(Path(tmp) / "tiny", seed=0))
        best: dict[str, tuple[float, dict[str, float]]] = {}
        for i in range(args.repeats):
            for mode in ("sync", "async"):
                sps, means = steps_per_second(args, model, Path(tmp) / f"{mode}-{i}", mode)
                print(
                    f"{mode:<6} repeat {i}: {sps:.3f} steps/s "
                    + " ".join(f"{k}={v:.3f}" for k, v in means.items()),
                    flush=True,
                )
                if mode not in best or sps > best[mode][0]:
                    best[mode] = (sps, means)
    ratio = best["async"][0] / best["sync"][0]
    shape = "4 x 4, 16 tokens a turn" if args.quick else "16 x 8, 48 tokens a turn"
    print(
        f"{shape}, {args.steps} steps, best of {args.repeats}: sync {best['sync'][0]:.3f} steps/s, "
        f"async {best['async'][0]:.3f} steps/s"
    )
    print(f"async/sync steps per second: {ratio:.2f}x")
    if not args.no_kv:
        import rollout_async  # the KV-reuse measurement lives with the other rollout benchmarks

        kv = [
            "--kv-reuse",
            "--turns",
            "3",
            "--n",
            "8" if args.quick else "32",
            "--repeats",
            str(args.repeats),
        ]
        rollout_async.main(kv + (["--model", args.model] if args.model else []))
    return ratio


if __name__ == "__main__":
    main()
