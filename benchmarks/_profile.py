"""Profile a short ``agentfly train`` run with py-spy and print where its time goes, by named part.

    python benchmarks/_profile.py                              # 4 steps of the calculator example
    python benchmarks/_profile.py --set threads=2 --out runs/bench/profile-threads2.txt
    python benchmarks/_profile.py --summarise runs/bench/profile.txt   # re-read a recorded profile

Records the real CLI (``agentfly train examples/calculator/grpo.yaml`` on the warm-started tiny model that
``trl_compare.py`` builds, 4 small steps) in py-spy's raw (collapsed-stack) format, then reports each part's
inclusive share of the samples: start-up imports, the tool schema built at import, the rollout (the engine's
batched decode, the rollout loop's own Python), the update (forward, backward, optimizer) and the rest.
Not a benchmark of its own (the leading underscore keeps ``run_all.py`` from running it); its findings are
written up in ``docs/benchmarks-profile.md``.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# (label, a frame that marks the part). A sample counts for every part whose frame is on its stack; samples
# are per thread, so the engine's decode (a worker thread) and the trainer thread add up, not nest.
PARTS: list[tuple[str, str]] = [
    ("imports, wherever they happen", "_find_and_load ("),
    ("loading the model (with the imports it triggers)", "load_policy ("),
    ("the calculator's schema, built at import (pydantic)", "signature_schema ("),
    ("training steps, trainer thread", "Trainer.train_step ("),
    ("  rollout: the loop's own Python (render, parse, tools)", "RolloutRunner.run_one ("),
    ("  update: forward (logprobs, entropy)", "forward (trainer/loop.py)"),
    ("  update: backward", "Tensor.backward ("),
    ("  update: optimizer step", "Optimizer.profile_hook_step"),
    ("  update: collate", "collate ("),
    ("rollout: engine decode, worker thread", "HFEngine._decode ("),
    ("final evaluation", "evaluate (trainer/loop.py)"),
    ("checkpoint", "Trainer.save ("),
]


def summarise(path: Path) -> list[tuple[str, float]]:
    """Inclusive share of the samples for each part of ``PARTS``."""
    total = 0
    hits: Counter[str] = Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [re.sub(r":\d+\)", ")", f) for f in stack.split(";")]
        for label, marker in PARTS:
            if any(f.startswith(marker) for f in frames):
                hits[label] += n
    return [(label, hits[label] / total if total else 0.0) for label, _ in PARTS]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(REPO / "runs" / "bench" / "profile.txt"), help="raw py-spy profile")
    ap.add_argument("--model", default=None, help="model dir (default: the warm start trl_compare.py builds)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="extra config overrides")
    ap.add_argument("--rate", type=int, default=50, help="samples per second")
    ap.add_argument("--summarise", metavar="RAW", help="only summarise an existing raw profile")
    args = ap.parse_args(argv)

    if args.summarise:
        path = Path(args.summarise)
    else:
        spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        if not Path(spy).exists():
            sys.exit("py-spy is not installed: pip install 'agentfly[dev]' (or pip install py-spy)")
        model = args.model
        if model is None:
            sys.path.insert(0, str(REPO / "benchmarks"))
            from trl_compare import warm_start_model

            model = str(warm_start_model(REPO / "runs" / "bench", 0, 1, 1000, 3))
        out_dir = REPO / "runs" / "bench" / "profile-run"
        shutil.rmtree(out_dir, ignore_errors=True)
        overrides = [f"model.path={model}", f"output_dir={out_dir}", "steps=4", "max_minutes=null",
                     "rollout.prompts_per_step=4", "rollout.group_size=4", "data.eval_size=16", "eval.every=0",
                     "save_every=0", "progress=false", "threads=1", *args.overrides]
        cli = [sys.executable, "-m", "trainer.cli", "train", str(REPO / "examples" / "calculator" / "grpo.yaml")]
        for o in overrides:
            cli += ["--set", o]
        path = Path(args.out)
        path.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([spy, "record", "--format", "raw", "--rate", str(args.rate), "-o", str(path), "--", *cli],
                       check=True, cwd=REPO)
    print(f"{'part':<58}{'share of samples':>17}")
    for label, share in summarise(path):
        print(f"{label:<58}{share:>17.1%}")
    if not args.summarise:
        print(step_times(out_dir / "events.jsonl"))


def step_times(events: Path) -> str:
    """Mean wall and CPU seconds of steps 2..N from the run's event stream (step 1 pays for warm-up)."""
    import statistics

    from trainer.events import read_events

    steps = [e["data"] for e in read_events(events, "metrics") if "time/step" in e["data"]]
    steps = steps[1:] or steps
    wall = statistics.mean(s["time/step"] for s in steps)
    cpu = [s["time/step_cpu"] for s in steps if s.get("time/step_cpu") is not None]
    cpu_text = f", CPU {statistics.mean(cpu):.2f} s" if cpu else ""
    return f"per step (steps 2..{len(steps) + 1}): wall {wall:.2f} s{cpu_text}"


if __name__ == "__main__":
    main()
