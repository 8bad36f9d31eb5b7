"""Generation throughput: tokens/s of HFEngine and VLLMEngine on the tiny model at batch 1, 8 and 64, and the
agent loop's overhead over raw engine generation of the same tokens.

    python benchmarks/generation.py                      # both engines, batches 1 8 64, 64 new tokens
    python benchmarks/generation.py --engines hf --batches 1 8 --tokens 32
    python benchmarks/generation.py --model runs/tiny   # a model directory instead of a fresh tiny build

Each cell is ``B`` concurrent ``engine.generate`` calls (seeded, temperature 1) with a warm-up run first; the
rates count the tokens actually produced (a turn that samples an end-of-turn token stops early), per wall
second and per CPU second of this process; the engine ratio uses the CPU rate, which other load on a shared
machine hardly moves (torch and vLLM run one thread here). The
overhead rows run ``Agent.run`` on ``B`` arithmetic questions (one turn, the calculator tool declared, hermes
parsing) and then the same prompts with the same per-rollout seeds straight through ``engine.generate``; the
seeded samplers produce the same tokens both times (checked), so the difference is the agent loop's own work:
chat-template rendering, parsing, trajectory building, rewards. It is measured in CPU seconds of this process
(torch runs one thread), which other load on a shared machine hardly moves. The last line is that overhead as
a ratio, agent CPU time / raw generation CPU time, for the last engine measured.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# vLLM logs to stdout by default; the table is this script's stdout.
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

import torch

import agentfly as af
from agentfly.engines.base import Engine
from agentfly.rewards.builtin import math_equal
from agentfly.rollout.loop import turn_seed
from agentfly.tasks import arithmetic
from agentfly.tools.builtin import calculator


def build_engine(name: str, model_dir: Path) -> Engine:
    if name == "hf":
        from agentfly.engines.hf import HFEngine

        return HFEngine(model_dir)
    if name == "vllm":
        from agentfly.engines.vllm import VLLMEngine

        return VLLMEngine(model_dir)
    raise SystemExit(f"unknown engine {name!r}; choose hf or vllm")


def prompts_for(engine: Engine, n: int) -> list[list[int]]:
    tok = engine.tokenizer
    samples = arithmetic.generate(n, seed=0, split="bench")
    texts = [tok.apply_chat_template([{"role": "user", "content": s["question"]}], tokenize=False,
                                     add_generation_prompt=True) for s in samples]
    return [list(tok(t, add_special_tokens=False)["input_ids"]) for t in texts]


async def generate_all(engine: Engine, prompts: list[list[int]], samplings: list[af.Sampling]) -> list[Any]:
    return list(await asyncio.gather(*(engine.generate(p, s) for p, s in zip(prompts, samplings, strict=True))))


def throughput(engine: Engine, batch: int, tokens: int, repeats: int) -> tuple[float, float]:
    """(tokens per wall second, tokens per CPU second of this process) for ``batch`` concurrent requests.

    Each is the best of ``repeats`` timed runs after a warm-up run (allocations, vLLM's first batch shapes).
    """
    prompts = prompts_for(engine, batch)
    best_wall = best_cpu = 0.0
    for r in range(repeats + 1):
        samplings = [af.Sampling(temperature=1.0, max_new_tokens=tokens, seed=1000 * r + i) for i in range(batch)]
        wall, cpu = time.perf_counter(), time.process_time()
        gens = asyncio.run(generate_all(engine, prompts, samplings))
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        if r > 0:
            produced = sum(len(g.token_ids) for g in gens)
            best_wall, best_cpu = max(best_wall, produced / wall), max(best_cpu, produced / max(cpu, 1e-9))
    return best_wall, best_cpu


def agent_overhead(engine: Engine, batch: int, tokens: int, repeats: int) -> tuple[float, float, int]:
    """(agent CPU seconds, raw generation CPU seconds, tokens) for the same ``batch`` rollouts.

    CPU time of this process (all its threads), not wall time: on a shared machine other processes stretch
    wall time by tens of percent from one run to the next, while the work this process does stays put. The
    two alternate, which goes first switching each round, and each keeps its fastest round.
    """
    agent = af.Agent(model=engine, tools=[calculator], reward=math_equal, max_turns=1)
    samples = arithmetic.generate(batch, seed=0, split="bench")
    sampling = af.Sampling(temperature=1.0, max_new_tokens=tokens, seed=7)
    # A first agent run warms up and records the requests the loop makes: each rollout's prompt, its seed for
    # turn 0 and the parser's stop strings.
    trajectories = asyncio.run(agent.run(samples, group_size=1, sampling=sampling))
    if any(t.error for t in trajectories):
        raise RuntimeError(f"a rollout failed: {next(t.error for t in trajectories if t.error)}")
    prompts = [t.token_ids[: t.prompt_length] for t in trajectories]
    samplings = [sampling.replace(seed=turn_seed(sampling.seed, i, 0),
                                  stop=tuple(dict.fromkeys((*sampling.stop, *agent.parser.stop))))
                 for i in range(len(trajectories))]

    def run_agent() -> float:
        start = time.process_time()
        again = asyncio.run(agent.run(samples, group_size=1, sampling=sampling))
        seconds = time.process_time() - start
        if [t.token_ids for t in again] != [t.token_ids for t in trajectories]:
            raise RuntimeError("the seeded agent rollouts changed between runs; the comparison is void")
        return seconds

    def run_raw() -> float:
        start = time.process_time()
        gens = asyncio.run(generate_all(engine, prompts, samplings))
        seconds = time.process_time() - start
        for t, g in zip(trajectories, gens, strict=True):
            if t.token_ids[t.prompt_length: t.prompt_length + len(g.token_ids)] != g.token_ids:
                raise RuntimeError("raw generation did not reproduce the agent's tokens; the comparison is void")
        return seconds

    agent_times: list[float] = []
    raw_times: list[float] = []
    for r in range(repeats):
        if r % 2:
            agent_times.append(run_agent())
            raw_times.append(run_raw())
        else:
            raw_times.append(run_raw())
            agent_times.append(run_agent())
    produced = sum(len(t.token_ids) - t.prompt_length for t in trajectories)
    return min(agent_times), min(raw_times), produced


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engines", nargs="+", default=["hf", "vllm"])
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 8, 64])
    ap.add_argument("--tokens", type=int, default=64, help="max new tokens per request")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per cell after one warm-up (best is kept)")
    ap.add_argument("--overhead-batch", type=int, default=64)
    ap.add_argument("--model", type=Path, default=None, help="model directory (default: build the tiny model)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the machine is shared)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)  # before vLLM starts: it pins its OpenMP threads to this count

    # Libraries print to stdout while models load (DeepSpeed's accelerator notice, for one); the table is
    # this script's stdout, so everything before it goes to stderr.
    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(sys.stderr):
        model_dir = args.model or af.models.build_tiny(Path(tmp) / "tiny", seed=0)
        rates: dict[tuple[str, int], tuple[float, float]] = {}
        overheads: dict[str, tuple[float, float, int]] = {}
        for name in args.engines:
            start = time.perf_counter()
            engine = build_engine(name, model_dir)
            print(f"[{name}] engine ready in {time.perf_counter() - start:.1f} s", file=sys.stderr)
            try:
                for b in args.batches:
                    rates[name, b] = throughput(engine, b, args.tokens, args.repeats)
                    print(f"[{name}] batch {b}: {rates[name, b][0]:.0f} tok/s, {rates[name, b][1]:.0f} tok/CPU-s",
                          file=sys.stderr)
                overheads[name] = agent_overhead(engine, args.overhead_batch, args.tokens, args.repeats)
            finally:
                engine.close()

    model = "the tiny model" if args.model is None else str(args.model)
    print(f"{model}, {args.threads} torch thread(s), up to {args.tokens} new tokens per request, best of {args.repeats}")
    print()
    both = {"hf", "vllm"} <= set(args.engines)
    head = "| batch | " + " | ".join(f"{n} tok/s | {n} tok/CPU-s" for n in args.engines)
    head += " | vllm / hf (CPU) |" if both else " |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for b in args.batches:
        row = f"| {b} | " + " | ".join(f"{rates[n, b][0]:.0f} | {rates[n, b][1]:.0f}" for n in args.engines)
        row += f" | {rates['vllm', b][1] / rates['hf', b][1]:.2f}x |" if both else " |"
        print(row)
    print()
    print(f"| agent loop, {args.overhead_batch} rollouts | agent CPU s | raw generate CPU s | tokens | agent / raw |")
    print("|---|---|---|---|---|")
    for name, (agent_s, raw_s, produced) in overheads.items():
        print(f"| {name} | {agent_s:.3f} | {raw_s:.3f} | {produced} | {agent_s / raw_s:.2f}x |")
    last = args.engines[-1]
    agent_s, raw_s, _ = overheads[last]
    print(f"agent loop overhead over raw {last} generation of the same tokens: {agent_s / raw_s:.2f}x")


if __name__ == "__main__":
    main()
