"""Training step: what masking and bookkeeping cost on top of a bare forward/backward, and where the time
of one full training step goes.

    python benchmarks/training_step.py
    python benchmarks/training_step.py --prompts 16 --group 8 --repeats 10
    python benchmarks/training_step.py --model smollm2 --threads 2   # SmolLM2-135M-Instruct, both cores

Part 1, the update. A batch of real trajectories of the calculator task is made by the rollout layer with
the turns written by ``ReplayEngine`` (call the calculator, then answer, right or wrong at random, so groups
have non-zero advantages): real chat template, tool schemas, observation glue and loss masks, and the
tiny model's logprobs by teacher forcing. Two updates of the same model run on it, interleaved:

- **plain floor**: ``collate``, one forward over every position of every row, the logprob of every next
  token, a plain mean (no mask, no advantages, no metrics), backward, AdamW step.
- **floor**: the same, but with the trainer's forward (``trainer.batch.forward``), which computes the prompt
  prefix every row shares once and each GRPO group's question once, broadcasting their KV caches, and the
  rows' own tokens in buckets of similar length: the least the trainer's update can cost.
- **trainer update**: ``Trainer._update``, exactly what a training step runs: collate, advantages from the
  rewards, that forward at the sampling temperature with the entropy, the clipped surrogate over mask-1
  tokens only, the metrics read back, gradient clipping, AdamW step.

Trainer update / floor is what masking and bookkeeping cost; plain floor / floor is what sharing the prefixes
(and bucketing) saves.

Part 2 (``--no-stages`` skips it) runs ``Trainer.train_step`` a few times with the HF engine sampling from
the tiny model and reports each timed stage's share of the step (rollout, reward, logprobs, advantages,
update, weight sync).

The last line is the ratio trainer update / floor (1.00 means masking and bookkeeping are free).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def build_trainer(args: argparse.Namespace, model_dir: Path) -> Any:
    """A ``Trainer`` on the tiny model with the calculator task, writing into a temporary directory."""
    from trainer.config import load_config
    from trainer.loop import Trainer

    config = load_config(None, [
        f"output_dir={tempfile.mkdtemp(prefix='agentfly-bench-step-')}", f"model.path={model_dir}",
        f"rollout.prompts_per_step={args.prompts}", f"rollout.group_size={args.group}",
        f"rollout.max_new_tokens={args.max_new_tokens}", f"rollout.max_turns={args.max_turns}",
        f"algorithm.name={args.algorithm}", "data.train_size=2000", "data.eval_size=8", "progress=false",
        "log_samples=0", f"threads={args.threads}", f"seed={args.seed}",
    ])
    return Trainer(config)


def replay_batch(trainer: Any, args: argparse.Namespace) -> tuple[list[Any], list[float], list[int]]:
    """Trajectories of the calculator task through the real rollout path, with written turns."""
    import agentfly as af
    from agentfly.tasks import arithmetic

    rng = random.Random(args.seed)
    samples = arithmetic.generate(args.prompts, seed=args.seed, split="bench")
    by_question = {s["question"]: s for s in samples}

    def script(prompt: str) -> str:
        sample = next(s for q, s in by_question.items() if q in prompt)
        if "<tool_response>" not in prompt:
            call = {"name": "calculator", "arguments": {"expression": sample["expression"]}}
            return "<tool_call>\n" + json.dumps(call) + "\n</tool_call>"
        answer = sample["answer"] if rng.random() < 0.5 else str(int(sample["answer"]) + rng.randint(1, 99))
        return f"The answer is {answer}."

    engine = af.ReplayEngine(trainer.tokenizer, script, model=trainer.model)
    agent = af.Agent(engine, tools=[af.tools.builtin.calculator], reward=af.rewards.builtin.math_equal,
                     max_turns=args.max_turns)
    trajectories = agent.run_sync(samples, group_size=args.group, sampling=af.Sampling(temperature=1.0))
    bad = [t.error for t in trajectories if t.error]
    if bad:
        raise RuntimeError(f"replayed rollouts failed: {bad[0]}")
    groups = [i // args.group for i in range(len(trajectories))]
    return trajectories, [t.reward for t in trajectories], groups


def floor_update(trainer: Any, trajectories: list[Any], rewards: list[float], groups: list[int], *,
                 shared_prefix: bool) -> None:
    """Forward, next-token logprobs, a plain mean over every position, backward, AdamW step."""
    from trainer.algorithms import token_logprobs
    from trainer.batch import collate, forward

    batch = collate(trajectories, rewards, groups, trainer.pad_id, trainer.device)
    trainer.model.train()
    if shared_prefix:
        logp, _, _ = forward(trainer.model, batch, 1.0)
    else:
        logits = trainer.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                               use_cache=False).logits
        logp = token_logprobs(logits[:, :-1], batch.input_ids[:, 1:])
    loss = -logp.mean()
    trainer.learner.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    trainer.learner.optimizer.step()
    trainer.model.eval()


def trainer_update(trainer: Any, trajectories: list[Any], rewards: list[float], groups: list[int]) -> None:
    from trainer.metrics import StageTimer

    trainer._update(trajectories, rewards, groups, StageTimer())


def time_interleaved(fns: dict[str, Callable[[], Any]], repeats: int, warmup: int = 1) -> dict[str, list[float]]:
    """Run each function ``repeats`` times, alternating between them so machine noise hits all alike."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times


def update_comparison(trainer: Any, args: argparse.Namespace) -> float:
    trajectories, rewards, groups = replay_batch(trainer, args)
    times = time_interleaved({
        "plain": lambda: floor_update(trainer, trajectories, rewards, groups, shared_prefix=False),
        "floor": lambda: floor_update(trainer, trajectories, rewards, groups, shared_prefix=True),
        "masked": lambda: trainer_update(trainer, trajectories, rewards, groups),
    }, args.repeats)
    plain = statistics.median(times["plain"])
    floor, masked = statistics.median(times["floor"]), statistics.median(times["masked"])
    trained = sum(t.num_trained_tokens for t in trajectories)
    total = sum(len(t.token_ids) for t in trajectories)
    longest = max(len(t.token_ids) for t in trajectories)
    print(f"update on {len(trajectories)} trajectories (pad to {longest} tokens, {total} real, {trained} trained, "
          f"mean reward {statistics.mean(rewards):.2f}), median of {args.repeats}")
    print(f"{'update':<40}{'ms':>9}{'trained tok/s':>15}")
    print(f"{'plain floor (every row in full)':<40}{plain * 1e3:>9.1f}{trained / plain:>15.0f}")
    print(f"{'floor (shared-prefix forward)':<40}{floor * 1e3:>9.1f}{trained / floor:>15.0f}")
    print(f"{f'trainer update ({args.algorithm}, masked)':<40}{masked * 1e3:>9.1f}{trained / masked:>15.0f}")
    print(f"sharing the prompt prefix, plain floor / floor: {plain / floor:.2f}")
    return masked / floor


def stage_breakdown(trainer: Any, args: argparse.Namespace) -> None:
    """``Trainer.train_step`` a few times; the mean seconds of each ``time/<stage>`` metric."""
    stages: dict[str, list[float]] = {}
    for _ in range(args.stage_steps):
        metrics = trainer.train_step()
        for key, value in metrics.items():
            if key.startswith("time/"):
                stages.setdefault(key.removeprefix("time/"), []).append(float(value))
    # The first step pays for warm-up (allocator, thread pool): leave it out when there are more.
    mean = {k: statistics.mean(v[1:] or v) for k, v in stages.items()}
    step = mean.pop("step")
    cpu = mean.pop("step_cpu", None)
    print(f"\nstage breakdown of one training step ({args.prompts}x{args.group} rollouts sampled by the HF engine, "
          f"mean of steps 2..{args.stage_steps})")
    print(f"{'stage':<40}{'ms':>9}{'share':>8}")
    for key, value in sorted(mean.items(), key=lambda kv: -kv[1]):
        print(f"{key:<40}{value * 1e3:>9.1f}{value / step:>8.0%}")
    print(f"{'step (wall)':<40}{step * 1e3:>9.1f}{1:>8.0%}")
    if cpu is not None:
        print(f"{'step (this process, CPU time)':<40}{cpu * 1e3:>9.1f}")
        # The machine's limit is every thread busy for the whole step: CPU seconds / (wall seconds x threads).
        print(f"{f'use of {args.threads} threads (CPU / wall x threads)':<40}{cpu / (step * args.threads):>17.0%}")
    import resource

    print(f"{'peak memory of this process (MiB)':<40}{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:>9.0f}")


def default_model(af: Any) -> Path:
    """The warm-started tiny model ``trl_compare.py`` builds, when it is there (its rollouts call the
    calculator, as a training run's do); else the untrained tiny model, whose rollouts rarely call a tool."""
    warm = sorted(Path(__file__).resolve().parents[1].glob("runs/bench/tiny-sft-*/model.safetensors"))
    if warm:
        return warm[0].parent
    return Path(af.models.build_tiny(Path(tempfile.gettempdir()) / "agentfly-bench-tiny", seed=0))


def main(argv: list[str] | None = None) -> float:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8, help="task samples per batch")
    ap.add_argument("--group", type=int, default=4, help="rollouts per sample")
    ap.add_argument("--algorithm", default="grpo", help="trainer algorithm (algorithm.name)")
    ap.add_argument("--max-new-tokens", type=int, default=32, help="tokens per sampled turn (part 2)")
    ap.add_argument("--max-turns", type=int, default=3, help="assistant turns per rollout")
    ap.add_argument("--repeats", type=int, default=5, help="timed updates per variant (the median counts)")
    ap.add_argument("--stage-steps", type=int, default=3, help="training steps for the stage breakdown")
    ap.add_argument("--no-stages", action="store_true", help="skip the stage breakdown")
    ap.add_argument("--model", default=None,
                    help="model dir, or smollm2 (its converted checkpoint); default: build the tiny model")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads (1: least disturbed by other load on a shared machine)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    import agentfly as af

    if args.model == "smollm2":
        from agentfly.models.smollm2 import checkpoint_dir

        model_dir = checkpoint_dir()
    else:
        model_dir = Path(args.model) if args.model else default_model(af)
    repo = Path(__file__).resolve().parents[1]
    shown = model_dir.resolve().relative_to(repo) if model_dir.resolve().is_relative_to(repo) else model_dir
    print(f"model: {shown}")
    trainer = build_trainer(args, model_dir)
    try:
        ratio = update_comparison(trainer, args)
        if not args.no_stages:
            stage_breakdown(trainer, args)
    finally:
        trainer.events.close()
    print(f"trainer update / floor: {ratio:.2f}")
    return ratio


if __name__ == "__main__":
    main()
