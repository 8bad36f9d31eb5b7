"""``HFEngine``: batched sampling with a KV cache from a Hugging Face ``transformers`` causal LM.

Concurrent ``generate`` calls from many rollouts are collected into one batch: each call queues a request,
and one drain task per event loop takes everything queued (after letting every runnable rollout submit),
runs a left-padded batched decode in a worker thread, and resolves each caller's future. Rows that finish
are dropped from the batch (and from the KV cache) so a long tail does not pay for finished rows.

Sampling draws one uniform number per row from that row's own generator when ``Sampling.seed`` is set,
so a seeded rollout samples the same tokens whatever else shares its batch.

Run ``python -m agentfly.engines.hf MODEL_DIR "prompt"`` to sample from a local model.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from agentfly.engines.base import Engine, Generation, Sampling


@dataclass
class _Request:
    prompt: list[int]
    sampling: Sampling
    future: asyncio.Future[Generation]


@dataclass
class EngineStats:
    batches: int = 0
    sequences: int = 0
    prompt_tokens: int = 0
    prefill_tokens: int = 0  # prompt tokens actually run through the model (shared prefixes count once)
    generated_tokens: int = 0
    busy_seconds: float = 0.0
    max_batch: int = 0

    def as_dict(self) -> dict[str, float]:
        tps = self.generated_tokens / self.busy_seconds if self.busy_seconds else 0.0
        return {
            "batches": float(self.batches),
            "sequences": float(self.sequences),
            "prompt_tokens": float(self.prompt_tokens),
            "prefill_tokens": float(self.prefill_tokens),
            "generated_tokens": float(self.generated_tokens),
            "busy_seconds": round(self.busy_seconds, 4),
            "tokens_per_second": round(tps, 2),
            "max_batch": float(self.max_batch),
        }


def _eos_ids(model: Any, tokenizer: Any) -> list[int]:
    ids: list[int] = []
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for tok in [*(gen_eos if isinstance(gen_eos, list) else [gen_eos]), tokenizer.eos_token_id]:
        if tok is not None and tok not in ids:
            ids.append(int(tok))
    return ids


def filter_probs(probs: torch.Tensor, top_p: float, top_k: int) -> torch.Tensor:
    """Zero the probabilities outside top-k / the top-p nucleus. probs: [B, V] -> [B, V] (unnormalised)."""
    if top_k > 0 and top_k < probs.shape[-1]:
        kth = torch.topk(probs, top_k, dim=-1).values[:, -1:]
        probs = torch.where(probs < kth, torch.zeros_like(probs), probs)
    if top_p < 1.0:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        cum = sorted_p.cumsum(-1)
        # Keep a token if the mass before it is below top_p (the first token is always kept).
        keep_sorted = (cum - sorted_p) < top_p * cum[:, -1:]
        keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
        probs = probs * keep
    return probs


def _batch_key(sampling: Sampling) -> Sampling:
    return sampling.replace(seed=None, max_new_tokens=1)


class HFEngine(Engine):
    """Generation from a ``transformers`` causal LM, batching concurrent requests.

    model: a local directory (loaded with ``from_pretrained``) or an already-built ``PreTrainedModel`` (the
        trainer passes its own module, so weight sync is in place).
    tokenizer: defaults to ``AutoTokenizer.from_pretrained(model)``.
    max_batch_size: the most sequences decoded together.
    gguf_file: load a GGUF checkpoint inside ``model`` (needs the ``gguf`` package).
    min_shared_prefix: the shortest prefix common to a whole batch that is computed once and broadcast
        (identical prompts are always computed once).
    """

    def __init__(
        self,
        model: str | os.PathLike[str] | Any,
        tokenizer: Any = None,
        *,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        max_batch_size: int = 256,
        max_model_len: int | None = None,
        gguf_file: str | None = None,
        min_shared_prefix: int = 16,
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if isinstance(model, (str, os.PathLike)):
            path = os.fspath(model)
            if not os.path.isdir(path):
                raise FileNotFoundError(f"model directory {path!r} does not exist (models are loaded from local paths)")
            kwargs: dict[str, Any] = {"gguf_file": gguf_file} if gguf_file else {}
            device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
            dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
            loaded: Any = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kwargs)
            model = loaded.to(device)
            tokenizer = tokenizer or AutoTokenizer.from_pretrained(path, **kwargs)
        elif tokenizer is None:
            raise ValueError("HFEngine(model=<module>) needs tokenizer=")
        self.model: Any = model
        self.tokenizer: Any = tokenizer
        self.device = next(model.parameters()).device
        self.stop_token_ids = _eos_ids(model, tokenizer)
        if not self.stop_token_ids:
            raise ValueError("the tokenizer and generation config name no EOS token; set tokenizer.eos_token")
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad) if pad is not None else self.stop_token_ids[0]
        config_len: Any = getattr(self.model.config, "max_position_embeddings", 4096)
        self.max_model_len = int(max_model_len or config_len)
        self.max_batch_size = max_batch_size
        self.min_shared_prefix = min_shared_prefix
        self.counters = EngineStats()
        self._pending: list[_Request] = []
        self._drainer: asyncio.Task[None] | None = None
        self._lock = threading.Lock()  # one decode at a time on the shared module

    # ------------------------------------------------------------------ async API
    async def generate(self, prompt_ids: Sequence[int], sampling: Sampling) -> Generation:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Generation] = loop.create_future()
        self._pending.append(_Request(list(prompt_ids), sampling, future))
        if self._drainer is None or self._drainer.done() or self._drainer.get_loop() is not loop:
            self._drainer = loop.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        while self._pending:
            # Yield a few times so every rollout that is ready to generate joins this batch.
            for _ in range(3):
                await asyncio.sleep(0)
            # Rows may differ in seed and token budget (the rollout loop caps each budget by the context
            # left), so those are per row; everything else must match to share one decode.
            key = _batch_key(self._pending[0].sampling)
            batch = [r for r in self._pending if _batch_key(r.sampling) == key and not r.future.done()]
            batch = batch[: self.max_batch_size]
            taken = {id(r) for r in batch}
            self._pending = [r for r in self._pending if id(r) not in taken and not r.future.done()]
            if not batch:
                continue
            try:
                results = await asyncio.to_thread(self.generate_batch, [r.prompt for r in batch],
                                                  [r.sampling for r in batch])
            except Exception as exc:
                for r in batch:
                    if not r.future.done():
                        r.future.set_exception(exc)
                continue
            for r, res in zip(batch, results, strict=True):
                if not r.future.done():
                    r.future.set_result(res)

    # ------------------------------------------------------------------ batched decode
    def generate_batch(self, prompts: Sequence[Sequence[int]], samplings: Sequence[Sampling]) -> list[Generation]:
        """Decode a batch synchronously. All ``samplings`` must agree except for ``seed`` and ``max_new_tokens``."""
        with self._lock, torch.inference_mode():
            start = time.perf_counter()
            out = self._decode(prompts, samplings)
            st = self.counters
            st.batches += 1
            st.sequences += len(prompts)
            st.max_batch = max(st.max_batch, len(prompts))
            st.prompt_tokens += sum(len(p) for p in prompts)
            st.generated_tokens += sum(len(g.token_ids) for g in out)
            st.busy_seconds += time.perf_counter() - start
            return out

    def _decode(self, prompts: Sequence[Sequence[int]], samplings: Sequence[Sampling]) -> list[Generation]:
        sampling = samplings[0]
        n = len(prompts)
        results: list[Generation | None] = [None] * n
        budgets = [min(s.max_new_tokens, self.max_model_len - len(p)) for p, s in zip(prompts, samplings, strict=True)]
        rows = [i for i in range(n) if budgets[i] > 0 and len(prompts[i]) > 0]
        for i in range(n):
            if i not in rows:
                results[i] = Generation([], [], "length")
        if not rows:
            return [r for r in results if r is not None]
        gens = [None if s.seed is None else torch.Generator(device="cpu").manual_seed(s.seed) for s in samplings]
        logits, cache, mask, step_pos = self._prefill([prompts[i] for i in rows])
        out_tokens: list[list[int]] = [[] for _ in range(n)]
        out_logps: list[list[float]] = [[] for _ in range(n)]
        stop_ids = torch.tensor(self.stop_token_ids, device=self.device)
        stop_strings = sampling.stop
        active = list(rows)  # original indices of rows still decoding, in batch order
        while active:
            if sampling.temperature == 0:
                logp_all = torch.log_softmax(logits, dim=-1)
                next_tokens = logits.argmax(-1)
            else:
                logp_all = torch.log_softmax(logits / sampling.temperature, dim=-1)
                probs = filter_probs(logp_all.exp(), sampling.top_p, sampling.top_k)
                cdf = probs.cumsum(-1)
                u = torch.stack([
                    torch.rand((), generator=gens[i]) if gens[i] is not None else torch.rand(())
                    for i in active
                ]).to(self.device)
                next_tokens = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(-1)).squeeze(-1)
                next_tokens = next_tokens.clamp(max=logits.shape[-1] - 1)
            token_logps = logp_all.gather(-1, next_tokens.unsqueeze(-1)).squeeze(-1)
            is_stop = torch.isin(next_tokens, stop_ids).tolist()
            toks, lps = next_tokens.tolist(), token_logps.tolist()
            keep: list[int] = []
            for r, i in enumerate(active):
                out_tokens[i].append(toks[r])
                out_logps[i].append(lps[r])
                reason: tuple[str, Any] | None = None
                if is_stop[r]:
                    reason = ("stop", toks[r])
                elif stop_strings:
                    tail = self.tokenizer.decode(out_tokens[i][-16:], skip_special_tokens=False)
                    hit = next((s for s in stop_strings if s in tail), None)
                    if hit is not None:
                        reason = ("stop", hit)
                if reason is None and len(out_tokens[i]) >= budgets[i]:
                    reason = ("length", None)
                if reason is None:
                    keep.append(r)
                else:
                    results[i] = Generation(out_tokens[i], out_logps[i], reason[0], reason[1])  # type: ignore[arg-type]
            if not keep:
                break
            if len(keep) < len(active):
                index = torch.tensor(keep, device=self.device)
                cache.batch_select_indices(index)
                mask = mask.index_select(0, index)
                step_pos = step_pos.index_select(0, index)
                next_tokens = next_tokens.index_select(0, index)
                active = [active[r] for r in keep]
            mask = torch.cat([mask, torch.ones((len(active), 1), dtype=mask.dtype, device=self.device)], dim=1)
            step_pos = step_pos + 1
            outputs = self.model(input_ids=next_tokens.unsqueeze(-1), attention_mask=mask, position_ids=step_pos,
                                 past_key_values=cache, use_cache=True, logits_to_keep=1)
            cache = outputs.past_key_values
            logits = outputs.logits[:, -1, :].float()
        return [r for r in results if r is not None]

    def _prefill(self, prompts: Sequence[Sequence[int]]) -> tuple[torch.Tensor, Any, torch.Tensor, torch.Tensor]:
        """Run the prompts through the model once; returns the next-token logits [R, V], the KV cache, the
        attention mask [R, T] and each row's last position [R, 1].

        Work is shared where prompts share tokens: identical prompts (the ``group_size`` samples of one task)
        are computed once, and the prefix common to every prompt (system prompt and tool schemas) is computed
        once at batch size 1; both are broadcast through the cache. A row's cache is laid out as
        ``[shared prefix | left padding | its own suffix]`` with the padding masked and positions counted over
        real tokens only, so every row sees exactly its own prompt.
        """
        unique: dict[tuple[int, ...], int] = {}
        row_to_unique = [unique.setdefault(tuple(p), len(unique)) for p in prompts]
        distinct = list(unique)
        shared = min(len(p) for p in distinct) - 1  # every row keeps at least one token of its own
        first = distinct[0]
        for p in distinct[1:]:
            shared = next((k for k in range(shared) if p[k] != first[k]), shared)
        cache = None
        if shared >= self.min_shared_prefix:
            prefix = torch.tensor([first[:shared]], dtype=torch.long, device=self.device)
            cache = self.model(input_ids=prefix, use_cache=True, logits_to_keep=1).past_key_values
            self.counters.prefill_tokens += shared
            if len(distinct) > 1:
                cache.batch_repeat_interleave(len(distinct))
        else:
            shared = 0
        width = max(len(p) for p in distinct) - shared
        ids = torch.full((len(distinct), width), self.pad_id, dtype=torch.long)
        own = torch.zeros((len(distinct), width), dtype=torch.long)
        for u, p in enumerate(distinct):
            ids[u, width - (len(p) - shared):] = torch.tensor(p[shared:], dtype=torch.long)
            own[u, width - (len(p) - shared):] = 1
        mask = torch.cat([torch.ones((len(distinct), shared), dtype=torch.long), own], dim=1).to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, shared:]
        outputs = self.model(input_ids=ids.to(self.device), attention_mask=mask, position_ids=positions,
                             past_key_values=cache, use_cache=True, logits_to_keep=1)
        cache = outputs.past_key_values
        self.counters.prefill_tokens += sum(len(p) - shared for p in distinct)
        logits = outputs.logits[:, -1, :].float()
        if len(distinct) < len(prompts):
            index = torch.tensor(row_to_unique, device=self.device)
            cache.batch_select_indices(index)
            logits, mask, positions = logits[index], mask[index], positions[index]
        return logits, cache, mask, positions[:, -1:]

    def stats(self) -> dict[str, float]:
        return self.counters.as_dict()

    # ------------------------------------------------------------------ weights
    def update_weights(self, state_dict: Mapping[str, Any]) -> None:
        """Copy ``state_dict`` into the model. A no-op when the trainer shares the engine's module."""
        own = self.model.state_dict()
        with torch.no_grad():
            for name, value in state_dict.items():
                target = own.get(name)
                if target is None:
                    raise KeyError(f"update_weights: the engine's model has no parameter {name!r}")
                if target.data_ptr() != value.data_ptr():
                    target.copy_(value.to(target.device, target.dtype))


def _main() -> None:  # pragma: no cover - manual tool
    import sys

    engine = HFEngine(sys.argv[1])
    ids = engine.tokenizer(sys.argv[2] if len(sys.argv) > 2 else "Hello")["input_ids"]
    gen = asyncio.run(engine.generate(ids, Sampling(temperature=0.7, max_new_tokens=40)))
    print(engine.tokenizer.decode(gen.token_ids), gen.finish_reason)


if __name__ == "__main__":  # pragma: no cover
    _main()
