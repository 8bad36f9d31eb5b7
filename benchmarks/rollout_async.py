"""Async tools: N rollouts whose tool sleeps per call, run concurrently by the rollout layer versus one at a
time. The model's turns are replayed through the tiny model (``ReplayEngine`` with teacher-forced logprobs,
so every turn costs a real forward pass) and each rollout makes ``--turns`` tool calls before answering.

    python benchmarks/rollout_async.py --n 32 --turns 3 --latency 0.2

The last line is the speed-up of concurrent over sequential; the ideal is bounded by N and by generation.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time

import torch


def main(argv: list[str] | None = None) -> float:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=32, help="trajectories")
    ap.add_argument("--turns", type=int, default=3, help="tool calls per trajectory")
    ap.add_argument("--latency", type=float, default=0.2, help="seconds each tool call sleeps")
    ap.add_argument("--repeats", type=int, default=2, help="runs per setting; the fastest counts")
    ap.add_argument("--model", default=None, help="model dir (default: build the tiny model in a temp dir)")
    args = ap.parse_args(argv)
    torch.set_num_threads(2)

    import agentfly as af
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = args.model or af.models.build_tiny(tempfile.mkdtemp(prefix="agentfly-bench-"), seed=0)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()

    @af.tool
    async def lookup(key: str) -> str:
        """Look a key up in a slow service.

        Args:
            key: What to look up.
        """
        await asyncio.sleep(args.latency)
        return f"value of {key}"

    def script(prompt: str) -> str:
        done = prompt.count("<tool_response>")
        if done < args.turns:
            return "<tool_call>\n" + json.dumps({"name": "lookup", "arguments": {"key": f"k{done}"}}) + "\n</tool_call>"
        return "The answer is 42."

    samples = [{"id": i, "question": f"Question {i}?"} for i in range(args.n)]

    def run(concurrency: int) -> tuple[float, list[af.Trajectory]]:
        """Best of ``--repeats`` runs (the machine is shared and noisy)."""
        best, trajs = float("inf"), []
        for _ in range(args.repeats):
            engine = af.ReplayEngine(tokenizer, script, model=model)
            agent = af.Agent(model=engine, tools=[lookup], max_turns=args.turns + 1, max_concurrency=concurrency)
            start = time.perf_counter()
            trajs = agent.run_sync(samples, group_size=1, sampling=af.Sampling(temperature=1.0))
            best = min(best, time.perf_counter() - start)
        return best, trajs

    # Generation alone: the same forward passes with no tool latency (the bound on overlap).
    lat, args.latency = args.latency, 0.0
    t_gen, _ = run(args.n)
    args.latency = lat
    t_seq, trajs_seq = run(1)
    t_con, trajs_con = run(args.n)
    assert all(len(t.tool_calls) == args.turns and t.tool_errors == 0 for t in trajs_seq + trajs_con)
    ideal = max(t_gen, args.turns * args.latency)
    print(f"{'setting':<34}{'seconds':>10}")
    print(f"{'tools only (n x turns x latency)':<34}{args.n * args.turns * args.latency:>10.2f}")
    print(f"{'generation only, concurrent':<34}{t_gen:>10.2f}")
    print(f"{'sequential (one at a time)':<34}{t_seq:>10.2f}")
    print(f"{'concurrent (rollout layer)':<34}{t_con:>10.2f}")
    print(f"{'ideal concurrent':<34}{ideal:>10.2f}")
    print(f"overlap achieved vs ideal: {ideal / t_con:.2f}")
    ratio = t_seq / t_con
    print(f"speed-up concurrent/sequential (n={args.n}, turns={args.turns}, latency={lat}s): {ratio:.1f}x")
    return ratio


if __name__ == "__main__":
    main()
