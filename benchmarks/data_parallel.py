"""Data parallelism: trajectories per second and trained tokens per second of 2 ranks x 1 thread against 1 rank x 1 thread, same total batch.

    python benchmarks/data_parallel.py
    python benchmarks/data_parallel.py --prompts 8         # a small batch: overheads dominate

Both runs are the real command line on the tiny model with the HF engine sampling (calculator task, its
tools and reward), one torch thread per process: ``python -m trainer.cli train`` for one rank, and
``python -m torch.distributed.run --standalone --nproc_per_node 2 -m trainer.cli train`` for two, each rank
rolling out half the prompts of every step (the ranks average the gradients once per optimizer step, and
each rank's update makes the grouped forward passes its own rows need, as one rank's does). The numbers are
from the run's own events (rank 0 writes them; ``time/step`` is the slowest rank's): steps after the first, so process
start-up and the first step's warm-up are out of both. The last line is the ratio 2 ranks / 1 rank of
trajectories per second (2.00 would be perfect scaling; the target is 1.7).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def overrides(model: Path, out: Path, args: argparse.Namespace) -> list[str]:
    sets = [f"model.path={model}", "model.build_tiny=true", f"output_dir={out}", f"steps={args.steps}", "threads=1",
            "progress=false", f"rollout.prompts_per_step={args.prompts}", f"rollout.group_size={args.group}",
            "rollout.max_new_tokens=24", "rollout.max_turns=2", "data.train_size=256", "data.eval_size=2",
            "eval.max_new_tokens=4", "log_samples=0", "save_every=0"]
    return [a for s in sets for a in ("--set", s)]


def run(ranks: int, model: Path, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                              "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]),
               TOKENIZERS_PARALLELISM="false")
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks)]
                if ranks > 1 else [sys.executable])
    cmd = [*launcher, "-m", "trainer.cli", "train", *overrides(model, out, args)]
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"{ranks} rank(s): exit {done.returncode}")
    steps = [json.loads(line)["data"] for line in (out / "events.jsonl").read_text().splitlines()
             if '"time/rollout"' in line and json.loads(line)["type"] == "metrics"][1:]
    seconds = sum(s["time/step"] for s in steps)
    trajectories = len(steps) * args.prompts * args.group
    tokens = sum(s["response_length/mean"] * args.prompts * args.group for s in steps)
    return {"ranks": ranks, "steps": len(steps), "seconds": seconds, "traj_per_s": trajectories / seconds,
            "tokens_per_s": tokens / seconds, "cpu_s": sum(s["time/step_cpu"] for s in steps), "wall": wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=4, help="training steps per run (the first is not counted)")
    ap.add_argument("--prompts", type=int, default=32, help="prompts per step, in total over the ranks")
    ap.add_argument("--group", type=int, default=4, help="rollouts per prompt")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="agentfly-dp-") as tmp:
        model = Path(tmp) / "tiny"
        one = run(1, model, Path(tmp) / "one", args)  # builds the tiny model; the 2-rank run reuses it
        two = run(2, model, Path(tmp) / "two", args)
    print(f"the tiny model, HF engine, {args.prompts} prompts x {args.group} rollouts per step in total, "
          f"{one['steps']} steps counted, 1 torch thread per rank")
    print("| ranks | step s | trajectories/s | trained tokens/s | CPU s (all ranks) | process wall s |")
    print("|---|---|---|---|---|---|")
    for r in (one, two):
        print(f"| {r['ranks']} | {r['seconds'] / r['steps']:.2f} | {r['traj_per_s']:.1f} | {r['tokens_per_s']:.0f} | "
              f"{r['cpu_s']:.1f} | {r['wall']:.0f} |")
    print(f"trained tokens/s, 2 ranks / 1 rank: {two['tokens_per_s'] / one['tokens_per_s']:.2f}x")
    print(f"trajectories/s, 2 ranks / 1 rank: {two['traj_per_s'] / one['traj_per_s']:.2f}x")


if __name__ == "__main__":
    main()
