"""The ``agentfly`` command line.

    agentfly demo                                            # tiny model, a few rollouts, masks shown
    agentfly sft   examples/calculator/sft.yaml              # supervised warm start on demonstrations
    agentfly train examples/calculator/grpo.yaml --set algorithm.name=rloo
    agentfly train examples/calculator/grpo.yaml --resume runs/calculator/checkpoint-latest
    agentfly eval  runs/calculator/checkpoint-latest --split test --k 1 4 --samples 8 --json eval.json
    agentfly train --help-config                             # every config key with its help

Bad configuration exits with status 2 and a message naming the key and the fix.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import warnings
from pathlib import Path
from typing import Any

from trainer.config import Config, ConfigError, DataConfig, describe, load_config

# Notices from other packages that every run printed and nobody running AgentFly can act on. Silenced at the
# command line's entry only: a script that imports the library keeps them, and AgentFly's own warnings (and a
# third-party warning about how AgentFly calls it, which names AgentFly's module) are never filtered.
QUIET_LOGGERS = ("math_verify.parser", "math_verify.grader")  # "Timeout is disabled ...": the math rewards turn
# it off on purpose in worker threads, where math-verify's signal-based timeout cannot work.
QUIET_PACKAGES = ("torch", "transformers", "deepspeed", "accelerate", "huggingface_hub", "math_verify", "wandb",
                  "mlflow", "tensorboard", "google.protobuf", "pydantic", "vllm", "ray")


class _DropMessage(logging.Filter):
    def __init__(self, start: str) -> None:
        super().__init__()
        self.start = start

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.start)


_DEEPSPEED_CPU_GUESS = _DropMessage("Setting accelerator to CPU")  # one object: added once however often


def quiet_third_party() -> None:
    """Silence the known third-party noise for this process: the loggers above, DeepSpeed's guess of the
    accelerator on a machine without a GPU (the trainer picks its device itself), and deprecation notices
    raised inside other packages (addressed to their own code, not to a user of AgentFly)."""
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    # DeepSpeed builds its logger when imported (setting its level then), so a filter is what lasts.
    logging.getLogger("DeepSpeed").addFilter(_DEEPSPEED_CPU_GUESS)
    packages = "|".join(p.replace(".", r"\.") for p in QUIET_PACKAGES)
    for category in (DeprecationWarning, PendingDeprecationWarning, FutureWarning):
        warnings.filterwarnings("ignore", category=category, module=rf"({packages})(\.|$)")


def _add_config_args(p: argparse.ArgumentParser, positional: bool = True) -> None:
    if positional:
        p.add_argument("config", nargs="?", help="YAML config (see examples/calculator/); without one, the "
                       "defaults and --set overrides are used")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set algorithm.name=rloo (repeatable)")


def _load(args: argparse.Namespace) -> Config:
    deepspeed = getattr(args, "deepspeed", None)
    return load_config(args.config, [*args.overrides, *([f"deepspeed={deepspeed}"] if deepspeed else [])])


def cmd_demo(args: argparse.Namespace) -> int:
    """A few rollouts of the default task (``data.task``'s default) with its own tools and reward."""
    import agentfly as af
    from agentfly.engines.hf import HFEngine
    from agentfly.tasks import get_task
    from trainer.builders import import_object

    task = get_task(DataConfig().task)
    path = args.model
    if path is None:
        path = af.models.build_tiny("runs/tiny", seed=0)
        print(f"built the tiny model in {path} (untrained: expect noise; `agentfly sft` teaches it the task)")
    engine = HFEngine(path)
    tools = [import_object(spec, "the task's tool") for spec in task.tools]
    agent = af.Agent(engine, tools=tools, reward=import_object(task.reward, "the task's reward"),
                     max_turns=args.max_turns)
    samples = task.samples("demo", args.n, args.seed)
    trajectories = agent.run_sync(samples, group_size=1, sampling=af.Sampling(
        temperature=args.temperature, max_new_tokens=args.max_new_tokens, seed=args.seed))
    for t in trajectories:
        print(f"\n=== {t.rollout_id}  reward={t.reward}  turns={t.num_turns}  finish={t.finish_reason}  "
              f"trained tokens={t.num_trained_tokens}/{len(t.token_ids)}")
        af.visualize_mask(t, engine.tokenizer)
    return 0


def cmd_sft(args: argparse.Namespace) -> int:
    from trainer.sft import run_sft

    config = _load(args)
    result = run_sft(config)
    print(json.dumps({"path": result["path"], "eval/accuracy": result["metrics"].get("eval/accuracy")}))
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    if args.help_config:
        print("\n".join(describe()))
        return 0
    from trainer.distributed import die_with_launcher, is_main_process
    from trainer.loop import train

    die_with_launcher()
    config = _load(args)
    stop = Path(args.stop_file) if args.stop_file else None
    result = train(config, resume=args.resume, should_stop=(lambda: stop.exists()) if stop else None)
    if is_main_process():  # one line per run, not per rank
        print(json.dumps({"checkpoint": result["checkpoint"], "step": result["step"], "state": result["state"],
                          "eval/accuracy": result["metrics"].get("eval/accuracy")}))
    return 0


def _checkpoint_config(path: Path, overrides: list[str]) -> Config:
    """The config a checkpoint was trained with (its own config.yaml, or its run's), pointed at it. Keys that
    this version does not know (a checkpoint from another version) are dropped with a warning."""
    import yaml

    from trainer.config import known_keys

    # A checkpoint is safetensors whatever the run loaded first (a GGUF file is dequantised once, at start).
    pointed = [*overrides, f"model.path={path}", "model.build_tiny=false", "model.gguf_file=null"]
    for candidate in (path / "config.yaml", path.parent / "config.yaml"):
        if candidate.is_file():
            saved, dropped = known_keys(yaml.safe_load(candidate.read_text()) or {})
            if dropped:
                print(f"agentfly: {candidate} has keys this version does not know, ignored: {', '.join(dropped)}",
                      file=sys.stderr)
            return load_config(None, pointed, base=saved)
    return load_config(None, pointed)


def cmd_eval(args: argparse.Namespace) -> int:
    import torch

    from agentfly.engines.hf import HFEngine
    from trainer.builders import build_agent, load_policy, load_samples, setup_torch
    from trainer.checkpoint import resolve
    from trainer.evaluation import report, run_eval, sampled_eval, split_field, table

    path = resolve(args.checkpoint)
    overrides = [*args.overrides, f"data.eval_size={args.n}", "eval.size=null"] if args.n else list(args.overrides)
    if args.k:
        overrides.append(f"eval.pass_k=[{', '.join(map(str, args.k))}]")
    if args.samples is not None:
        overrides.append(f"eval.samples={args.samples}")
    if args.temperature is not None:
        overrides.append(f"eval.temperature={args.temperature}")
    config = _checkpoint_config(path, overrides)
    device = setup_torch(config)
    model, tokenizer = load_policy(config, device, path=str(path))
    model.eval()
    train_samples, test_samples = load_samples(config)
    samples = test_samples if args.split == "test" else train_samples
    samples = samples[: args.n or config.eval.size or config.data.eval_size]
    by = args.group_by or split_field(samples)
    # Without a split field the data itself is the one split: its file, or the built-in task and split.
    source = (Path(config.data.eval_path).name if args.split == "test" and config.data.eval_path
              else Path(config.data.task).name if Path(config.data.task).is_file() else f"{config.data.task}:{args.split}")
    # A gateway job's checkpoint too is evaluated in process, on rollout.tools: no agent waits for its samples.
    agent = build_agent(config, HFEngine(model=model, tokenizer=tokenizer), in_process=True)
    try:
        with torch.inference_mode():
            run = run_eval(agent, samples, config.eval.max_new_tokens, config.eval.batch_size, sampled_eval(config))
    finally:
        agent.close()
    rep = report(run, by, source)
    result: dict[str, Any] = {"checkpoint": str(path), "split": args.split, "n": len(run.greedy), **rep["all"],
                              "group_by": rep["group_by"], "splits": rep["splits"]}
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(table(rep))
    print(json.dumps(result))  # the last line, for scripts (examples/calculator/bar.sh reads it)
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="agentfly", description="Agentic RL for language-model agents.")
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("demo", help="build the tiny model, run a few rollouts, print them with their loss mask")
    p.add_argument("--model", default=None, help="local model directory (default: build runs/tiny)")
    p.add_argument("--n", type=int, default=2, help="problems to roll out")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--max-turns", type=int, default=3)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("sft", help="supervised warm start on generated demonstrations")
    _add_config_args(p)
    p.set_defaults(func=cmd_sft)

    p = sub.add_parser("train", help="masked RL (GRPO, Dr. GRPO, DAPO, RLOO, REINFORCE++, PPO)")
    _add_config_args(p)
    p.add_argument("--resume", default=None, help="checkpoint (or run directory) to continue from")
    p.add_argument("--deepspeed", default=None, metavar="DS_CONFIG.json",
                   help="train through deepspeed.initialize with this DeepSpeed config (ZeRO 1/2/3, bf16); "
                        "launch with `deepspeed` or `torchrun` for several GPUs (same as --set deepspeed=...)")
    p.add_argument("--help-config", action="store_true", help="list every config key with its help and exit")
    p.add_argument("--stop-file", default=None, metavar="PATH",
                   help="stop between steps (with a checkpoint) once PATH exists; every rank checks it together")
    # The `deepspeed` launcher passes --local_rank to every rank; LOCAL_RANK in the environment says the same.
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("eval", help="pass@1 (greedy), pass@k, mean turns and tool-error rate of a checkpoint, "
                                    "per task split, as a table and as JSON",
                       description="Evaluate a checkpoint on held-out problems. Prints a table (all problems, then "
                                   "one row per task split) and, as its last line, the same figures as JSON.")
    p.add_argument("checkpoint", help="checkpoint or model directory (or a run directory: its latest checkpoint)")
    p.add_argument("--split", choices=("test", "train"), default="test",
                   help="which problems: the held-out ones (test, default) or the training ones")
    p.add_argument("--n", type=int, default=None, help="problems (default: eval.size or data.eval_size)")
    p.add_argument("--k", type=int, nargs="+", default=None, metavar="K",
                   help="also report pass@K for each K (unbiased estimator, Chen et al. 2021) from --samples "
                        "rollouts per problem at --temperature (same as --set eval.pass_k=[K, ...])")
    p.add_argument("--samples", type=int, default=None, metavar="N",
                   help="rollouts per problem for pass@k (default: eval.samples, else the largest K)")
    p.add_argument("--temperature", type=float, default=None, metavar="T",
                   help="sampling temperature of the pass@k rollouts (default: eval.temperature, 1.0)")
    p.add_argument("--group-by", default=None, metavar="FIELD",
                   help="sample field that names a problem's split (default: the first of split, type, task_type, "
                        "task that the samples carry, preferring one with several values; else the data source)")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the report (all figures, per split) "
                                                                 "to PATH as JSON")
    _add_config_args(p, positional=False)
    p.set_defaults(func=cmd_eval)
    return ap


def main(argv: list[str] | None = None) -> int:
    quiet_third_party()
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ConfigError, FileNotFoundError) as exc:
        print(f"agentfly {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
