"""The HF engine's own continuous batcher (``agentfly.engines.hf``: its cache class and attention function)
against transformers' continuous batching (``generate_batch``: paged attention, its scheduler), on the same
model, the same prompts and the same number of new tokens, greedy: generated tokens per second at each batch.

    python benchmarks/hf_batching.py                          # the tiny model and SmolLM2, batches 8 and 32
    python benchmarks/hf_batching.py --models tiny --batches 8 --tokens 32

Both sides run in this process with the same torch threads (``--threads``), one after the other, after a
warm-up call each, best of ``--repeats``. SmolLM2-135M-Instruct is its safetensors copy
(``agentfly.models.smollm2.checkpoint_dir()``). Each request is a one-turn chat of a calculator question in
the model's own template. transformers' manager is kept between calls (``persistent_manager``), so its
start is not timed. Greedy on both sides, so the tokens should agree; the table says how many of the
sequences do (float32 on both; different kernels may round a near tie the other way). transformers' side is
given a paged cache of ``--cache-mib`` MiB (by default it sizes its cache from the free memory). The last
line is the ratio, ours over transformers', at the largest batch of the last model.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def model_dir(name: str) -> Path:
    if name == "tiny":
        from agentfly.models import build_tiny

        return build_tiny(Path(tempfile.mkdtemp(prefix="hf-batching-")), seed=0)
    if name == "smollm2":
        from agentfly.models.smollm2 import checkpoint_dir

        return checkpoint_dir()
    return Path(name)


def prompts(tokenizer, n: int) -> list[list[int]]:
    from agentfly.tasks import arithmetic

    samples = arithmetic.generate(n, seed=0, split="bench")
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": s["question"]}], tokenize=False,
                                           add_generation_prompt=True) for s in samples]
    return [list(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]


def ours(path: Path, batch: list[list[int]], tokens: int, repeats: int) -> tuple[float, list[list[int]]]:
    import agentfly as af
    from agentfly.engines.hf import HFEngine

    engine = HFEngine(path)
    sampling = af.Sampling(temperature=0.0, max_new_tokens=tokens)

    async def run() -> list[list[int]]:
        gens = await asyncio.gather(*(engine.generate(p, sampling) for p in batch))
        return [list(g.token_ids) for g in gens]

    try:
        asyncio.run(run())  # warm-up
        best, out = 0.0, []
        for _ in range(repeats):
            t0 = time.perf_counter()
            out = asyncio.run(run())
            best = max(best, sum(map(len, out)) / (time.perf_counter() - t0))
        return best, out
    finally:
        engine.close()


def theirs(path: Path, batch: list[list[int]], tokens: int, repeats: int, cache_mib: int,
           stop: list[int]) -> tuple[float, list[list[int]]]:
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")
    model.to("cuda" if torch.cuda.is_available() else "cpu").eval()  # where HFEngine puts its model
    config = GenerationConfig(max_new_tokens=tokens, do_sample=False, eos_token_id=stop, pad_token_id=stop[0])
    cfg = model.config
    heads = getattr(cfg, "num_key_value_heads", cfg.num_attention_heads)
    per_token = 2 * cfg.num_hidden_layers * heads * (cfg.hidden_size // cfg.num_attention_heads) * 4  # K and V, fp32
    page = 256
    blocks = max(len(batch) * 2, (cache_mib << 20) // (per_token * page))
    cb = ContinuousBatchingConfig(page_size=page, num_blocks=int(blocks), return_logprobs=True,
                                  max_batch_tokens=4096, use_cuda_graph=False)

    def run() -> list[list[int]]:
        # The manager (its cache, scheduler and thread) is kept between calls, as a serving process would.
        with torch.inference_mode():
            done = model.generate_batch(inputs=batch, generation_config=config, continuous_batching_config=cb,
                                        progress_bar=False, warmup=False, persistent_manager=True)
        by_id = sorted(done.items(), key=lambda kv: int(kv[0].removeprefix("req_")))  # in the order asked
        return [list(out.generated_tokens) for _, out in by_id]

    try:
        run()  # warm-up, and the manager's start
        best, out = 0.0, []
        for _ in range(repeats):
            t0 = time.perf_counter()
            out = run()
            best = max(best, sum(map(len, out)) / (time.perf_counter() - t0))
        return best, out
    finally:
        model.destroy_cached_continuous_batching_manager()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["tiny", "smollm2"], help="tiny, smollm2 or model folders")
    ap.add_argument("--batches", nargs="+", type=int, default=[8, 32])
    ap.add_argument("--tokens", type=int, default=64, help="new tokens per request")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cache-mib", type=int, default=512, help="transformers' paged cache")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import torch
    from transformers import AutoTokenizer

    torch.set_num_threads(args.threads)
    print(f"{'model':>8} {'batch':>5} {'ours tok/s':>11} {'transformers tok/s':>19} {'ratio':>6} {'same seqs':>9}")
    ratio = float("nan")
    for name in args.models:
        path = model_dir(name)
        tokenizer = AutoTokenizer.from_pretrained(path)
        stop = [t for t in {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")}
                if isinstance(t, int) and t >= 0]
        for b in args.batches:
            batch = prompts(tokenizer, b)
            mine, our_out = ours(path, batch, args.tokens, args.repeats)
            other, their_out = theirs(path, batch, args.tokens, args.repeats, args.cache_mib, stop)
            same = sum(1 for a, c in zip(our_out, their_out, strict=False)
                       if [t for t in a if t not in stop] == [t for t in c if t not in stop])
            ratio = mine / other
            print(f"{name:>8} {b:>5} {mine:>11.1f} {other:>19.1f} {ratio:>6.2f} {same:>5}/{b:<3}", flush=True)
    print(f"ours/transformers tokens per second at the largest batch: {ratio:.2f}")


if __name__ == "__main__":
    main()
