"""Per-turn credit on a long horizon: time to a held-out success target with outcome-only GRPO and with each
turn-level estimator, on the long key chain (6-10 dependent lookups) with the store's per-hop turn reward.

    python benchmarks/turn_credit.py --seeds 0 1 2 --minutes 15 --target 0.6
    python benchmarks/turn_credit.py --seeds 0 --minutes 1 --target 0.6 --eval-every 2   # a smoke run

Every run starts from the key-chain warm start and trains ``agentfly train examples/key_chain/grpo.yaml`` with
``data.task=key_chain_long``, ``rollout.tools=[...:lookup_rewarded]`` and one ``algorithm.credit``, evaluating
greedily on held-out chains every ``--eval-every`` steps. Runs go one after another (they would share the
cores otherwise). A run's time to target is its training seconds (wall time less evaluations and saves) at the
first evaluation whose accuracy reaches ``--target``. The last line is JSON: per credit, per seed, the time to
target (null when not reached in the budget), the start and best accuracy and the curve; and per credit
the median time, with its ratio to outcome-only's (the bar: the best estimator at most 2/3).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchmarks.time_to_accuracy import eval_curve  # noqa: E402

CONFIG = REPO / "examples" / "key_chain" / "grpo.yaml"
RUNS: dict[str, list[str]] = {  # label -> overrides
    "outcome": ["algorithm.name=grpo", "algorithm.credit=outcome"],
    "turn": ["algorithm.name=grpo", "algorithm.credit=turn"],
    "step": ["algorithm.name=grpo", "algorithm.credit=step"],
    "turn_gae": ["algorithm.name=ppo", "algorithm.credit=turn_gae"],
}


def run(label: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    out = Path(args.out) / f"{label}-seed{seed}"
    overrides = [f"output_dir={out}", f"seed={seed}", f"max_minutes={args.minutes}", "progress=false",
                 f"model.path={REPO / 'examples/key_chain/warm_start'}", "data.task=key_chain_long",
                 f"data.eval_size={args.eval_size}", "rollout.max_turns=11",
                 "rollout.tools=[agentfly.tools.builtin.lookup:lookup_rewarded]", f"eval.every={args.eval_every}",
                 "save_every=0", *RUNS[label]]
    cmd = [sys.executable, "-m", "trainer.cli", "train", str(CONFIG), *(a for o in overrides for a in ("--set", o))]
    subprocess.run(cmd, check=True, cwd=REPO)
    points = eval_curve(out)
    reached = next((seconds for _, seconds, acc in points if acc >= args.target), None)
    return {"label": label, "seed": seed, "reached_seconds": reached,
            "start": points[0][2] if points else None, "best": max((p[2] for p in points), default=None),
            "curve": points}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--minutes", type=float, default=15.0)
    parser.add_argument("--target", type=float, default=0.6)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--eval-size", type=int, default=200)
    parser.add_argument("--credits", nargs="+", default=list(RUNS), choices=list(RUNS))
    parser.add_argument("--out", default=str(REPO / "runs" / "turn_credit"))
    args = parser.parse_args()
    results = [run(label, seed, args) for label in args.credits for seed in args.seeds]
    summary: dict[str, Any] = {}
    for label in args.credits:
        times = [r["reached_seconds"] for r in results if r["label"] == label]
        reached = [t for t in times if t is not None]
        summary[label] = {"reached": f"{len(reached)}/{len(times)}",
                          "median_seconds": statistics.median(reached) if len(reached) == len(times) else None}
    base = summary.get("outcome", {}).get("median_seconds")
    for label, row in summary.items():
        row["ratio_to_outcome"] = (row["median_seconds"] / base) if base and row["median_seconds"] else None
        print(f"{label:10s} reached {row['reached']:5s} median {row['median_seconds']} s  "
              f"ratio to outcome-only {row['ratio_to_outcome']}")
    print(json.dumps({"target": args.target, "summary": summary, "runs": results}))


if __name__ == "__main__":
    main()
