"""``HFEngine``: continuously batched sampling with a KV cache from a Hugging Face ``transformers`` causal LM.

Concurrent ``generate`` calls from many rollouts share one decoding batch. Each call queues a request; one
drain task per event loop runs the batch one decode step at a time in a worker thread, and before every step
it admits the requests queued meanwhile (prefilled together, then merged into the batch's KV cache), so a
rollout back from a tool call joins at the next step instead of waiting for the batch to drain. Rows leave
the batch (and the KV cache) as they finish, so a long tail does not pay for finished rows.

Prefill work is shared: the prefix common to the requests admitted together (system prompt, tool schemas)
and identical prompts (a GRPO group) are computed once. That prefix is also held once for the whole batch
(``_Prefix``), not copied into every row's cache, and each decode step attends to it once for all rows
(``_prefix_attention``): a step is bound by reading the KV cache, and the system prompt was most of it.
Across turns, a finished turn's KV (its prompt and sampled tokens) is kept in a bounded cache keyed by those
token ids; the conversation's next prompt starts with them (the rollout layer never re-encodes text), so only
the new tokens (the observation and the template glue) are prefilled. ``stats()`` counts the tokens saved
(``prefill_tokens_saved``). The kept KV is dropped when the weights change.

Sampling draws one uniform number per row from that row's own generator when ``Sampling.seed`` is set,
so a seeded rollout samples the same tokens whatever else shares, joins or leaves its batch.

Run ``python -m agentfly.engines.hf MODEL_DIR "prompt"`` to sample from a local model.
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from agentfly.engines.base import Engine, Generation, Sampling

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase


@dataclass
class _Request:
    prompt: list[int]
    sampling: Sampling
    future: asyncio.Future[Generation] | None  # None for the synchronous ``generate_batch``


@dataclass
class _Row:
    """One sequence being decoded: its request, its own sampler and what it has produced so far."""

    request: _Request
    budget: int
    generator: torch.Generator | None
    tokens: list[int] = field(default_factory=list)
    logps: list[float] = field(default_factory=list)
    result: Generation | None = None


@dataclass(eq=False)
class _Prefix:
    """A prompt prefix every row of a batch starts with (the system prompt and tool schemas), its KV held once
    [1, KV heads, P, D] per layer instead of in every row; attention reads it once for all rows
    (``_prefix_attention``)."""

    ids: tuple[int, ...]
    kv: list[tuple[torch.Tensor, torch.Tensor]]
    version: int  # the weights it was computed with (``HFEngine._weights_version``)


@dataclass
class _Running:
    """The decoding batch: KV cache laid out ``[left padding | row's tokens]`` per row, its attention mask
    [R, L], each row's last position [R, 1] and its next-token logits [R, V]. With a ``prefix``, every row's
    tokens start after it: the cache, the mask and the columns hold the rest, positions count it."""

    rows: list[_Row]
    cache: Any  # a DynamicCache whose layers are ours (_growing_layer), which its types do not know
    mask: torch.Tensor
    positions: torch.Tensor
    logits: torch.Tensor
    key: Sampling
    prefix: _Prefix | None = None


@dataclass
class EngineStats:
    batches: int = 0  # prefill passes: each admits the requests waiting at that decode step
    sequences: int = 0
    prompt_tokens: int = 0
    prefill_tokens: int = 0  # prompt tokens actually run through the model (shared prefixes count once)
    prefill_tokens_saved: int = 0  # prompt tokens whose KV came from an earlier turn of the same conversation
    prefix_cache_hits: int = 0
    joined_mid_batch: int = 0  # requests admitted while other rows were decoding (continuous batching)
    decode_steps: int = 0
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
            "prefill_tokens_saved": float(self.prefill_tokens_saved),
            "prefix_cache_hits": float(self.prefix_cache_hits),
            "joined_mid_batch": float(self.joined_mid_batch),
            "decode_steps": float(self.decode_steps),
            "generated_tokens": float(self.generated_tokens),
            "busy_seconds": round(self.busy_seconds, 4),
            "tokens_per_second": round(tps, 2),
            "max_batch": float(self.max_batch),
        }


def _kv(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys, layer.values) for layer in cache.layers]


def _is_prefix_view(view: torch.Tensor | None, buffer: torch.Tensor | None) -> bool:
    return (view is not None and buffer is not None and view.data_ptr() == buffer.data_ptr()
            and view.shape[:2] == buffer.shape[:2] and view.stride() == buffer.stride())


def _headroom(need: int) -> int:
    """Columns to allocate for ``need``: half as many again (at least 16), so appends amortise to O(1)."""
    return need + max(need // 2, 16)


def _stacked(parts: Sequence[torch.Tensor], width: int, extra: int = 0) -> torch.Tensor:
    """One buffer [sum of rows, H, capacity, D] holding ``parts`` (each [R, H, T, D]) right-aligned in the
    first ``width`` columns, zeros on their left (padding is masked, but must be finite: a masked score of
    garbage times zero can still be NaN), with room to grow after them (``extra`` columns about to be
    appended, and headroom). One copy of each part."""
    first = parts[0]
    rows = sum(p.shape[0] for p in parts)
    buf = torch.empty((rows, first.shape[1], _headroom(width + extra), first.shape[3]), dtype=first.dtype,
                      device=first.device)
    r = 0
    for part in parts:
        n, t = part.shape[0], part.shape[2]
        buf[r: r + n, :, : width - t] = 0
        buf[r: r + n, :, width - t: width] = part
        r += n
    return buf


@functools.cache
def _growing_layer() -> type:
    """``DynamicLayer`` that appends in place: keys and values live in a buffer with room to grow
    [B, H, capacity, D], and ``keys``/``values`` are views of its filled columns.

    ``DynamicLayer`` concatenates at every decode step, which copies the whole cache of every row: at 128 rows
    of the tiny model that copy took a third of the decode step. Here a step writes one column, and the
    buffer grows by half its size when full (amortised O(1) per token). Rows leaving (``keep_rows``: the rows
    behind the new end move into the slots left, nothing else is copied; or ``batch_select_indices``)
    and leading padding columns dropped (``drop_leading``) keep a buffer with its room; anything else that
    replaces ``keys`` is adopted as the filled part at the next ``update``, which moves it into a new buffer.
    """
    from transformers.cache_utils import DynamicLayer

    class GrowingDynamicLayer(DynamicLayer):  # type: ignore[no-untyped-call]
        _kbuf: torch.Tensor | None = None
        _vbuf: torch.Tensor | None = None
        keys: Any
        values: Any

        def adopt(self, kbuf: torch.Tensor, vbuf: torch.Tensor, filled: int) -> None:
            """Hold these buffers, their first ``filled`` columns being the cache."""
            self.dtype, self.device, self.is_initialized = kbuf.dtype, kbuf.device, True
            self._kbuf, self._vbuf = kbuf, vbuf
            self.keys, self.values = kbuf[:, :, :filled], vbuf[:, :, :filled]

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
                   ) -> tuple[torch.Tensor, torch.Tensor]:
            if not self.is_initialized or self.keys is None or self.keys.numel() == 0:
                self.dtype, self.device, self.is_initialized = key_states.dtype, key_states.device, True
                self.keys = self.values = self._kbuf = self._vbuf = None
                filled = 0
            else:
                filled = self.keys.shape[-2]
                if not (_is_prefix_view(self.keys, self._kbuf) and _is_prefix_view(self.values, self._vbuf)):
                    self._kbuf = self._vbuf = None  # replaced from outside: move it into a new buffer
            need = filled + key_states.shape[-2]
            if self._kbuf is None or self._vbuf is None or need > self._kbuf.shape[-2]:
                new = key_states.shape[-2]
                self._kbuf = _stacked([self.keys if filled else key_states[:, :, :0]], filled, extra=new)
                self._vbuf = _stacked([self.values if filled else value_states[:, :, :0]], filled, extra=new)
            self._kbuf[:, :, filled:need] = key_states
            self._vbuf[:, :, filled:need] = value_states
            self.keys, self.values = self._kbuf[:, :, :need], self._vbuf[:, :, :need]
            return self.keys, self.values

        def batch_select_indices(self, indices: torch.Tensor) -> None:
            if self._kbuf is None or self._vbuf is None or not _is_prefix_view(self.keys, self._kbuf):
                super().batch_select_indices(indices)
                return
            filled = self.keys.shape[-2]  # one copy of the kept rows, room included
            self.adopt(self._kbuf.index_select(0, indices), self._vbuf.index_select(0, indices), filled)

        def keep_rows(self, order: torch.Tensor, moved: torch.Tensor, sources: torch.Tensor) -> None:
            """Keep rows ``order`` (the new row j is the old row ``order[j]``), where the kept rows are the
            first ``len(order)`` but for ``moved``, which take the rows ``sources`` from behind them: only
            those rows are copied, and the buffer is narrowed (a view), its room kept."""
            if self._kbuf is None or self._vbuf is None or not _is_prefix_view(self.keys, self._kbuf):
                super().batch_select_indices(order)
                return
            filled, n = self.keys.shape[-2], order.numel()
            if moved.numel():
                self._kbuf[moved] = self._kbuf[sources]
                self._vbuf[moved] = self._vbuf[sources]
            self.adopt(self._kbuf[:n], self._vbuf[:n], filled)

        def drop_leading(self, columns: int) -> None:
            """Forget the first ``columns`` columns (padding every row has): a view, nothing is copied."""
            if self._kbuf is None or self._vbuf is None or not _is_prefix_view(self.keys, self._kbuf):
                self.keys, self.values = self.keys[:, :, columns:], self.values[:, :, columns:]
                return
            self.adopt(self._kbuf[:, :, columns:], self._vbuf[:, :, columns:], self.keys.shape[-2] - columns)

    return GrowingDynamicLayer


def _gqa_sdpa(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
              is_causal: bool | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' SDPA attention, but with grouped-query heads handed to SDPA as they are
    (``enable_gqa``) when a padding mask is given too. transformers copies every key/value head
    ``num_key_value_groups`` times in that case on the CPU (``repeat_kv``): with a decode batch's KV cache
    that copy, made at every step of every layer, cost as much as the attention itself. Same numbers,
    gradients included."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if getattr(module, "num_key_value_groups", 1) > 1 and attention_mask is not None and not kwargs.get(
            "output_attentions"):
        out = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=True)
        return out.transpose(1, 2).contiguous(), None
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  is_causal=is_causal, **kwargs)


_SHARED = threading.local()  # .prefix: the _Prefix of the batch this thread's engine is running, or None


_PREFIX_SCORES_MAX = 1 << 25  # score elements of one layer's attention above which a prefill goes to SDPA
_PREFIX_FEW_ROWS = 4  # at this many rows or fewer, copying the prefix in front of each row's keys costs less


def _prefix_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, prefix_key: torch.Tensor,
                      prefix_value: torch.Tensor, mask: torch.Tensor | None, scaling: float | None) -> torch.Tensor:
    """Attention of every row's queries [B, H, q, D] over a prefix all rows share ([1, KV, P, D], visible to
    every query) and then their own keys [B, KV, S, D] (``mask`` [B, 1, q, S] as transformers builds it, or
    None: causal). The same numbers as attending over each row's whole cache. Returns [B, q, H, D].

    The prefix is read once for the batch, as one matrix product per head, and one softmax (in float32)
    covers both parts: a cache holding the prefix in every row streams it B times at every decode step,
    which made attention the largest part of a decode step. A prefill whose scores would exceed
    ``_PREFIX_SCORES_MAX`` elements (long prompts) hands SDPA the prefix broadcast to the rows instead, to
    keep its memory-efficient kernels; so does a batch of at most ``_PREFIX_FEW_ROWS`` rows, where the copy
    is small and one SDPA call replaces a dozen small operations.
    """
    B, H, q, D = query.shape
    kv, S, P = key.shape[1], key.shape[2], prefix_key.shape[2]
    if mask is None and q > 1:
        mask = torch.ones(q, S, dtype=torch.bool, device=query.device).tril(S - q)[None, None]
    if B <= _PREFIX_FEW_ROWS or B * H * q * (P + S) > _PREFIX_SCORES_MAX:
        full = None  # one query token and no padding: it sees every key
        if mask is not None:
            visible = (torch.ones if mask.dtype == torch.bool else torch.zeros)(
                (mask.shape[0], 1, q, P), dtype=mask.dtype, device=mask.device)
            full = torch.cat([visible, mask], -1).expand(B, 1, q, P + S)
        out = torch.nn.functional.scaled_dot_product_attention(
            query, torch.cat([prefix_key.expand(B, -1, -1, -1), key], 2),
            torch.cat([prefix_value.expand(B, -1, -1, -1), value], 2), attn_mask=full, scale=scaling,
            enable_gqa=kv != H)
        return out.transpose(1, 2).contiguous()
    g = H // kv
    scale = scaling if scaling is not None else D ** -0.5
    grouped = query.reshape(B, kv, g * q, D)  # query head kv * g + j attends with key head kv (GQA)
    flat = grouped.transpose(0, 1).reshape(kv, B * g * q, D)
    shared = torch.bmm(flat, prefix_key[0].transpose(-1, -2)).view(kv, B, g * q, P).transpose(0, 1)
    scores = torch.cat([shared, torch.matmul(grouped, key.transpose(-1, -2))], -1).float().mul_(scale)
    if mask is not None:
        own = scores[..., P:]
        m = mask.unsqueeze(2).expand(mask.shape[0], 1, g, q, S).reshape(mask.shape[0], 1, g * q, S)
        if m.dtype == torch.bool:
            own.masked_fill_(~m, float("-inf"))
        else:
            own.add_(m)
    probs = torch.softmax(scores, -1).to(value.dtype)
    out = torch.matmul(probs[..., P:], value)
    head_first = probs[..., :P].transpose(0, 1).reshape(kv, B * g * q, P)
    out += torch.bmm(head_first, prefix_value[0]).view(kv, B, g * q, D).transpose(0, 1)
    return out.reshape(B, H, q, D).transpose(1, 2).contiguous()


def _attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
               is_causal: bool | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """``agentfly_sdpa``: ``_prefix_attention`` while this thread's engine runs a batch with a shared
    prefix, else ``_gqa_sdpa`` (anything else calling the module, the trainer's update included, gets SDPA)."""
    prefix: _Prefix | None = getattr(_SHARED, "prefix", None)
    if prefix is None or kwargs.get("output_attentions"):
        return _gqa_sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                         is_causal=is_causal, **kwargs)
    prefix_key, prefix_value = prefix.kv[module.layer_idx]
    return _prefix_attention(query, key, value, prefix_key, prefix_value, attention_mask, scaling), None


def use_native_gqa(model: PreTrainedModel) -> bool:
    """Switch a model on transformers' ``sdpa`` attention to ``_attention`` (registered as ``agentfly_sdpa``):
    grouped-query heads go to SDPA as they are (``_gqa_sdpa``), and a shared prefix is attended once for the
    batch (``_prefix_attention``). Any other attention implementation is left as it is. Returns whether the
    model now runs on ``agentfly_sdpa``."""
    config = model.config
    impl = getattr(config, "_attn_implementation", None)
    if impl == "agentfly_sdpa":
        return True
    if impl != "sdpa":
        return False
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register("agentfly_sdpa", _attention)
    AttentionMaskInterface.register("agentfly_sdpa", sdpa_mask)
    model.set_attn_implementation("agentfly_sdpa")
    return True


def _full_attention_only(config: PretrainedConfig) -> bool:
    """Every layer attends over the whole sequence (no sliding window): a prefix can be held apart."""
    types = getattr(config, "layer_types", None)
    if types is not None:
        return all(t == "full_attention" for t in types)
    return not getattr(config, "sliding_window", None) or not getattr(config, "use_sliding_window", True)


def _new_cache(config: PretrainedConfig) -> Any:
    """An empty ``DynamicCache`` whose full-attention layers append in place (``_growing_layer``);
    sliding-window layers keep transformers' own."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    cache = DynamicCache(config=config)
    layers: list[Any] = cache.layers
    for i, layer in enumerate(layers):
        if type(layer) is DynamicLayer:
            layers[i] = _growing_layer()()
    return cache


def _stacked_cache(parts: Sequence[Sequence[tuple[torch.Tensor, torch.Tensor]]], width: int, config: PretrainedConfig,
                   extra: int = 0) -> Any:
    """A cache holding the rows of every part (each a list of per-layer (keys, values)) one after the other,
    each right-aligned in ``width`` columns behind zeros (``_stacked``): the layout of a merged batch."""
    cache = _new_cache(config)
    for i, layer in enumerate(cache.layers):
        keys = _stacked([p[i][0] for p in parts], width, extra)
        values = _stacked([p[i][1] for p in parts], width, extra)
        if hasattr(layer, "adopt"):
            layer.adopt(keys, values, width)
        else:  # a sliding-window layer: transformers' own update
            layer.update(keys[:, :, :width], values[:, :, :width])
    return cache


def _compaction(keep: Sequence[int]) -> tuple[list[int], list[int], list[int]]:
    """Rows ``keep`` (ascending) packed into the first ``len(keep)`` slots by moving the fewest: each slot
    left by a finished row takes a kept row from behind the new end. Returns the new order (slot j holds the
    old row ``order[j]``), the slots written and the rows copied into them."""
    n = len(keep)
    kept = set(keep)
    moved = [i for i in range(n) if i not in kept]
    sources = [i for i in keep if i >= n]
    order = list(range(n))
    for slot, source in zip(moved, sources, strict=True):
        order[slot] = source
    return order, moved, sources


def _left_pad(x: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    """Pad ``x`` with zeros on the left of ``dim`` to ``width``."""
    missing = width - x.shape[dim]
    if missing <= 0:
        return x
    shape = list(x.shape)
    shape[dim] = missing
    return torch.cat([torch.zeros(shape, dtype=x.dtype, device=x.device), x], dim=dim)


def _eos_ids(model: object, tokenizer: PreTrainedTokenizerBase) -> list[int]:
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


def load_causal_lm(path: str | os.PathLike[str], dtype: torch.dtype, gguf_file: str | None = None
                   ) -> tuple[Any, PreTrainedTokenizerBase]:
    """The model and tokenizer of a local directory (``from_pretrained``), or of a GGUF file inside it.

    A GGUF file is dequantised into a plain dense model in ``dtype``: transformers would otherwise keep the
    weights packed in GGUF blocks where it has kernels for them (not trainable), and it marks even a
    dequantised model as quantized, which ``save_pretrained`` refuses; the mark is dropped, since nothing
    quantized is left, so the model trains and saves as safetensors like any other.

    The model is ``Any``: transformers types ``PreTrainedModel.to`` through a decorator that mypy cannot call.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if gguf_file is None:
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype), AutoTokenizer.from_pretrained(path)
    from transformers import GgufConfig

    model: Any = AutoModelForCausalLM.from_pretrained(
        path, dtype=dtype, gguf_file=gguf_file, quantization_config=GgufConfig(gguf_file=gguf_file, dequantize=True))
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)
    return model, AutoTokenizer.from_pretrained(path, gguf_file=gguf_file)


class HFEngine(Engine):
    """Generation from a ``transformers`` causal LM, batching concurrent requests continuously.

    model: a local directory (loaded with ``from_pretrained``) or an already-built ``PreTrainedModel`` (the
        trainer passes its own module, so weight sync is in place).
    tokenizer: defaults to ``AutoTokenizer.from_pretrained(model)``.
    max_batch_size: the most sequences decoded together.
    gguf_file: load a GGUF checkpoint inside ``model``, dequantised (``load_causal_lm``; needs the ``gguf`` package).
    min_shared_prefix: the shortest prefix common to the requests admitted together that is computed once
        and broadcast (identical prompts are always computed once).
    prefix_cache_tokens: the most tokens of KV cache kept from finished turns for the conversation's next
        turn (least recently used first out); 0 turns reuse across turns off.
    """

    def __init__(
        self,
        model: str | os.PathLike[str] | PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase | None = None,
        *,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        max_batch_size: int = 256,
        max_model_len: int | None = None,
        gguf_file: str | None = None,
        min_shared_prefix: int = 16,
        prefix_cache_tokens: int = 65_536,
    ) -> None:
        if isinstance(model, (str, os.PathLike)):
            path = os.fspath(model)
            if not os.path.isdir(path):
                raise FileNotFoundError(f"model directory {path!r} does not exist (models are loaded from local paths)")
            device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
            dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
            loaded, own_tokenizer = load_causal_lm(path, dtype, gguf_file)
            module: PreTrainedModel = loaded.to(device)
            tokenizer = tokenizer or own_tokenizer
        elif tokenizer is None:
            raise ValueError("HFEngine(model=<module>) needs tokenizer=")
        else:
            module = model
        self.model = module
        self.tokenizer: PreTrainedTokenizerBase = tokenizer
        # A prefix shared by a batch's rows is held once and attended once (``_Prefix``) where the attention is
        # ours and no layer has a sliding window; otherwise it is copied into every row's cache.
        self._hold_prefix = use_native_gqa(module) and _full_attention_only(module.config)
        self.device = next(module.parameters()).device
        self.stop_token_ids = _eos_ids(module, tokenizer)
        if not self.stop_token_ids:
            raise ValueError("the tokenizer and generation config name no EOS token; set tokenizer.eos_token")
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad) if pad is not None else self.stop_token_ids[0]
        config_len: Any = getattr(self.model.config, "max_position_embeddings", 4096)
        self.max_model_len = int(max_model_len or config_len)
        self.max_batch_size = max_batch_size
        self.min_shared_prefix = min_shared_prefix
        self.prefix_cache_tokens = prefix_cache_tokens
        self.counters = EngineStats()
        self._pending: list[_Request] = []
        self._running: _Running | None = None
        self._drainer: asyncio.Task[None] | None = None
        self._lock = threading.RLock()  # one decode step at a time on the shared module
        # Finished turns' KV by the token ids it covers (prompt + sampled tokens but the last, never fed).
        # Each entry: the batch prefix it continues (None: its KV covers every token) and the KV after it.
        self._prefix: OrderedDict[tuple[int, ...], tuple[_Prefix | None, list[tuple[torch.Tensor, torch.Tensor]]]] = (
            OrderedDict())
        self._prefix_size = 0
        self._shared: OrderedDict[tuple[int, ...], _Prefix] = OrderedDict()  # batch prefixes, by their token ids
        self._weights_seen = self._weights_version()

    # ------------------------------------------------------------------ async API
    async def generate(self, prompt_ids: Sequence[int], sampling: Sampling) -> Generation:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Generation] = loop.create_future()
        self._pending.append(_Request(list(prompt_ids), sampling, future))
        if self._drainer is None or self._drainer.done() or self._drainer.get_loop() is not loop:
            self._drainer = loop.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        """Continuous batching: before every decode step, the waiting requests that fit (same sampling
        settings as the running rows, room under ``max_batch_size``) are prefilled and join the batch; rows
        leave the batch as they finish. A rollout back from its tool call joins at the next step instead
        of waiting for the batch to drain (Orca, Yu et al. OSDI 2022: iteration-level scheduling)."""
        while self._pending or self._running is not None:
            if self._running is None:
                # Idle: yield a few times so every rollout that is ready to generate joins the first step.
                for _ in range(3):
                    await asyncio.sleep(0)
            admit = self._take_pending()
            try:
                finished = await asyncio.to_thread(self._advance, admit)
            except Exception as exc:
                failed = [*admit, *(r.request for r in self._running.rows)] if self._running else admit
                self._running = None
                for req in failed:
                    if req.future is not None and not req.future.done():
                        req.future.set_exception(exc)
                continue
            for row in finished:
                future = row.request.future
                if future is not None and not future.done() and row.result is not None:
                    future.set_result(row.result)

    def _take_pending(self) -> list[_Request]:
        self._pending = [r for r in self._pending if r.future is None or not r.future.done()]
        if not self._pending:
            return []
        # Rows may differ in seed and token budget (the rollout loop caps each budget by the context left),
        # so those are per row; everything else must match to share one decode.
        key = self._running.key if self._running is not None else _batch_key(self._pending[0].sampling)
        room = self.max_batch_size - (len(self._running.rows) if self._running is not None else 0)
        taken = [r for r in self._pending if _batch_key(r.sampling) == key][: max(room, 0)]
        ids = {id(r) for r in taken}
        self._pending = [r for r in self._pending if id(r) not in ids]
        return taken

    # ------------------------------------------------------------------ batched decode
    def generate_batch(self, prompts: Sequence[Sequence[int]], samplings: Sequence[Sampling]) -> list[Generation]:
        """Decode a batch synchronously. All ``samplings`` must agree except for ``seed`` and ``max_new_tokens``."""
        requests = [_Request(list(p), s, None) for p, s in zip(prompts, samplings, strict=True)]
        with self._lock:  # re-entrant: the whole batch runs before an async drain may step again
            if self._running is not None:
                raise RuntimeError("generate_batch was called while awaited generate() calls are decoding on this "
                                   "engine; await them first (or use a second engine)")
            rows = self._advance(requests)
            while self._running is not None:
                rows += self._advance([])
        by_request = {id(r.request): r.result for r in rows}
        return [g for g in (by_request[id(r)] for r in requests) if g is not None]

    def _advance(self, admit: Sequence[_Request]) -> list[_Row]:
        """Admit ``admit`` into the running batch, then sample one token for every row; returns the rows
        that finished (each with its ``result``). Runs in a worker thread, one call at a time."""
        with self._lock, torch.inference_mode():
            start = time.perf_counter()
            finished = self._admit(admit)
            if self._running is not None:
                finished += self._decode_step()
            st = self.counters
            st.generated_tokens += sum(len(r.tokens) for r in finished)
            st.busy_seconds += time.perf_counter() - start
            return finished

    def _admit(self, admit: Sequence[_Request]) -> list[_Row]:
        """Prefill the admitted requests and merge them into the running batch; requests with no room to
        generate come back at once, finished with ``length``."""
        if not admit:
            return []
        st = self.counters
        st.sequences += len(admit)
        st.prompt_tokens += sum(len(r.prompt) for r in admit)
        done: list[_Row] = []
        rows: list[_Row] = []
        for req in admit:
            row = _Row(req, min(req.sampling.max_new_tokens, self.max_model_len - len(req.prompt)),
                       None if req.sampling.seed is None else torch.Generator(device="cpu").manual_seed(req.sampling.seed))
            if row.budget <= 0 or not req.prompt:
                row.result = Generation([], [], "length")
                done.append(row)
            else:
                rows.append(row)
        if not rows:
            return done
        if self._running is not None:
            st.joined_mid_batch += len(rows)
        version = self._weights_version()
        if version != self._weights_seen:  # the trainer stepped the shared module: old KV is stale
            self.clear_prefix_cache()
            self._weights_seen = version
        hits = [(row, self._lookup(row.request.prompt)) for row in rows]
        fresh = [row for row, (_, _, n) in hits if n == 0]
        parts: list[_Running] = [] if self._running is None else [self._running]
        key = _batch_key(rows[0].request.sampling)
        if fresh:
            parts.append(self._prefill(fresh, key))
        # Reused turns, one prefill for each batch prefix their kept KV continues.
        Kept = list[tuple[torch.Tensor, torch.Tensor]]
        by_prefix: dict[int, tuple[_Prefix | None, list[tuple[_Row, Kept, int]]]] = {}
        for row, (prefix, kv, n) in hits:
            if n > 0:
                by_prefix.setdefault(id(prefix), (prefix, []))[1].append((row, kv, n))
        for prefix, reuse in by_prefix.values():
            parts.append(self._prefill_reusing(reuse, key, prefix))
        st.batches += 1
        self._running = parts[0] if len(parts) == 1 else self._merge(parts)
        st.max_batch = max(st.max_batch, len(self._running.rows))
        return done

    def _decode_step(self) -> list[_Row]:
        run = self._running
        assert run is not None
        sampling = run.key
        self.counters.decode_steps += 1
        logits = run.logits if sampling.temperature == 0 else run.logits / sampling.temperature
        logp_all = torch.log_softmax(logits, dim=-1)
        next_tokens = self._sample(run, logp_all)
        token_logps = logp_all.gather(-1, next_tokens.unsqueeze(-1)).squeeze(-1)
        is_stop = torch.isin(next_tokens, torch.tensor(self.stop_token_ids, device=self.device)).tolist()
        toks, lps = next_tokens.tolist(), token_logps.tolist()
        keep: list[int] = []
        finished: list[_Row] = []
        for i, row in enumerate(run.rows):
            row.tokens.append(toks[i])
            row.logps.append(lps[i])
            reason: tuple[str, str | int | None] | None = None
            if is_stop[i]:
                reason = ("stop", toks[i])
            elif sampling.stop:
                tail = self.tokenizer.decode(row.tokens[-16:], skip_special_tokens=False)
                hit = next((s for s in sampling.stop if s in tail), None)
                if hit is not None:
                    reason = ("stop", hit)
            if reason is None and len(row.tokens) >= row.budget:
                reason = ("length", None)
            if reason is None:
                keep.append(i)
            else:
                row.result = Generation(row.tokens, row.logps, reason[0], reason[1])  # type: ignore[arg-type]
                finished.append(row)
                self._remember(run, i)
        if not keep:
            self._running = None
            return finished
        if len(keep) < len(run.rows):
            order, moved, sources = _compaction(keep)
            index = torch.tensor(order, device=self.device)
            moved_t = torch.tensor(moved, dtype=torch.long, device=self.device)
            sources_t = torch.tensor(sources, dtype=torch.long, device=self.device)
            for layer in run.cache.layers:
                if hasattr(layer, "keep_rows"):
                    layer.keep_rows(index, moved_t, sources_t)
                else:
                    layer.batch_select_indices(index)
            run.mask = run.mask.index_select(0, index)
            run.positions = run.positions.index_select(0, index)
            next_tokens = next_tokens.index_select(0, index)
            run.rows = [run.rows[i] for i in order]
            # Columns that were padding for every row left (the finished rows were the longest): drop them.
            first = int(run.mask.any(0).nonzero()[0])
            if first:
                run.mask = run.mask[:, first:]
                for layer in run.cache.layers:
                    if hasattr(layer, "drop_leading"):
                        layer.drop_leading(first)
                    else:
                        layer.keys, layer.values = layer.keys[:, :, first:], layer.values[:, :, first:]
        run.mask = torch.cat([run.mask, torch.ones((len(run.rows), 1), dtype=run.mask.dtype, device=self.device)], 1)
        run.positions = run.positions + 1
        outputs = self._forward(run.prefix, input_ids=next_tokens.unsqueeze(-1), attention_mask=run.mask,
                                position_ids=run.positions, past_key_values=run.cache, use_cache=True,
                                logits_to_keep=1)
        run.cache = outputs.past_key_values
        run.logits = outputs.logits[:, -1, :].float()
        return finished

    def _sample(self, run: _Running, logp_all: torch.Tensor) -> torch.Tensor:
        """The next token of every row [R] from its logprobs [R, V] under the sampling distribution."""
        sampling = run.key
        if sampling.temperature == 0:
            return logp_all.argmax(-1)
        probs = filter_probs(logp_all.exp(), sampling.top_p, sampling.top_k)
        cdf = probs.cumsum(-1)
        # One uniform per row from the row's own generator: a seeded row samples the same tokens whatever
        # else shares (or joins, or leaves) the batch.
        u = torch.stack([
            torch.rand((), generator=r.generator) if r.generator is not None else torch.rand(()) for r in run.rows
        ]).to(self.device)
        next_tokens = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(-1)).squeeze(-1)
        return next_tokens.clamp(max=logp_all.shape[-1] - 1)

    def _forward(self, prefix: _Prefix | None, **inputs: Any) -> Any:
        """The model on ``inputs``, attending over ``prefix`` first when there is one (``_attention``)."""
        _SHARED.prefix = prefix
        try:
            return self.model(**inputs)
        finally:
            _SHARED.prefix = None

    def _merge(self, parts: Sequence[_Running]) -> _Running:
        """One batch from several: each part's cache and mask left-padded to the longest, then stacked. Parts
        on different prefixes first take theirs into their rows (``_prefix_in_rows``)."""
        prefix = parts[0].prefix
        if any(p.prefix is not prefix for p in parts):
            laid, prefix = [self._prefix_in_rows(p) for p in parts], None
        else:
            laid = [(_kv(p.cache), p.mask) for p in parts]
        width = max(mask.shape[1] for _, mask in laid)
        return _Running(
            rows=[r for p in parts for r in p.rows],
            cache=_stacked_cache([kv for kv, _ in laid], width, self.model.config),
            mask=torch.cat([_left_pad(mask, width, 1) for _, mask in laid]),
            positions=torch.cat([p.positions for p in parts]),
            logits=torch.cat([p.logits for p in parts]),
            key=parts[0].key,
            prefix=prefix,
        )

    def _prefix_in_rows(self, part: _Running) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
        """``part``'s per-layer KV and mask with its prefix copied in front of every row (``[prefix | padding |
        row]``), so it can share a batch with rows on another prefix; as they are when it has none."""
        if part.prefix is None:
            return _kv(part.cache), part.mask
        R, P = len(part.rows), len(part.prefix.ids)
        kv = [(torch.cat([pk.expand(R, -1, -1, -1), k], 2), torch.cat([pv.expand(R, -1, -1, -1), v], 2))
              for (pk, pv), (k, v) in zip(part.prefix.kv, _kv(part.cache), strict=True)]
        return kv, torch.cat([torch.ones((R, P), dtype=part.mask.dtype, device=self.device), part.mask], 1)

    # ------------------------------------------------------------------ KV reuse across turns
    def _lookup(self, prompt: list[int]) -> tuple[_Prefix | None, list[tuple[torch.Tensor, torch.Tensor]], int]:
        """The stored KV of the longest earlier turn whose tokens start ``prompt`` (the batch prefix it
        continues, and its KV after that prefix), and how many of its tokens to reuse, prefix included (at
        least one prompt token is always run, for the next-token logits); ``(None, [], 0)`` when none. The
        entry is taken out: the row's longer KV replaces it when the turn ends."""
        n = len(prompt)
        best: tuple[int, ...] | None = None
        for key in self._prefix:
            k = len(key)
            # Cheap checks on two tokens first: most entries are other conversations.
            if (k <= n and (best is None or k > len(best)) and key[-1] == prompt[k - 1]
                    and key[k // 2] == prompt[k // 2] and tuple(prompt[:k]) == key):
                best = key
        if best is None:
            return None, [], 0
        prefix, kv = self._prefix.pop(best)
        self._prefix_size -= len(best)
        use = min(len(best), n - 1)
        held = len(prefix.ids) if prefix is not None else 0
        if use <= held:
            return None, [], 0
        return prefix, [(k[:, :, :use - held], v[:, :, :use - held]) for k, v in kv], use

    def _remember(self, run: _Running, i: int) -> None:
        """Keep the KV of finished row ``i`` (its real columns only) for the conversation's next turn."""
        row = run.rows[i]
        length = len(row.request.prompt) + len(row.tokens) - 1
        if self.prefix_cache_tokens <= 0 or length > self.prefix_cache_tokens or length <= 0:
            return
        cols = run.mask[i].nonzero().squeeze(-1)
        kv = [(k[i: i + 1].index_select(2, cols), v[i: i + 1].index_select(2, cols)) for k, v in _kv(run.cache)]
        key = tuple(row.request.prompt + row.tokens[:-1])
        held = len(run.prefix.ids) if run.prefix is not None else 0
        assert kv[0][0].shape[2] + held == len(key), "a row's real KV columns must be its prompt and fed tokens"
        if key in self._prefix:
            self._prefix_size -= len(key)
        self._prefix[key] = (run.prefix, kv)
        self._prefix.move_to_end(key)
        self._prefix_size += len(key)
        while self._prefix_size > self.prefix_cache_tokens:
            old, _ = self._prefix.popitem(last=False)
            self._prefix_size -= len(old)

    def _prefill_reusing(self, reuse: Sequence[tuple[_Row, list[tuple[torch.Tensor, torch.Tensor]], int]],
                         key: Sampling, prefix: _Prefix | None) -> _Running:
        """Prefill rows whose conversation's earlier turn left its KV: only the new tokens (the last sampled
        token, the observation, the template glue) run through the model. Layout per row:
        ``[padding | its cached KV | padding | its new tokens]`` after ``prefix`` (the batch prefix the kept
        KV continues), positions counted over real tokens only."""
        held = len(prefix.ids) if prefix is not None else 0
        past_width = max(n for _, _, n in reuse) - held
        new = [row.request.prompt[n:] for row, _, n in reuse]
        width = max(map(len, new))
        ids = torch.full((len(reuse), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(reuse), past_width + width), dtype=torch.long)
        for r, ((_, _, n), tokens) in enumerate(zip(reuse, new, strict=True)):
            ids[r, width - len(tokens):] = torch.tensor(tokens, dtype=torch.long)
            mask[r, past_width - (n - held): past_width] = 1
            mask[r, past_width + width - len(tokens):] = 1
        mask = mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, past_width:] + held
        outputs = self._forward(prefix, input_ids=ids.to(self.device), attention_mask=mask, position_ids=positions,
                                past_key_values=_stacked_cache([kv for _, kv, _ in reuse], past_width,
                                                               self.model.config, extra=width),
                                use_cache=True, logits_to_keep=1)
        st = self.counters
        st.prefill_tokens += sum(map(len, new))
        st.prefill_tokens_saved += sum(n for _, _, n in reuse)
        st.prefix_cache_hits += len(reuse)
        return _Running([row for row, _, _ in reuse], outputs.past_key_values, mask, positions[:, -1:],
                        outputs.logits[:, -1, :].float(), key, prefix)

    def clear_prefix_cache(self) -> None:
        """Forget the KV kept from earlier turns (it belongs to the weights that computed it)."""
        self._prefix.clear()
        self._prefix_size = 0
        self._shared.clear()

    def _weights_version(self) -> int:
        # Every in-place write to a parameter (an optimizer step on the trainer's shared module, a copy in
        # ``update_weights``) bumps its version counter, so the sum changes whenever the weights may have.
        return sum(p._version for p in self.model.parameters())

    def _prefill(self, rows: Sequence[_Row], key: Sampling) -> _Running:
        """Run the rows' prompts through the model once; returns them as a batch (next-token logits, KV cache,
        attention mask [R, T], each row's last position).

        Work is shared where prompts share tokens: identical prompts (the ``group_size`` samples of one task)
        are computed once, and the prefix common to every prompt (system prompt and tool schemas) is computed
        once at batch size 1. Where the engine holds prefixes apart (``_Prefix``), that prefix stays out of
        the rows' caches, the running batch's prefix serves when every prompt starts with it, and a prefix's
        KV is kept for the next admission with the same tokens (``_shared_prefix``); otherwise the prefix is
        broadcast into every row's cache. A row's cache is laid out ``[shared prefix | left padding | its own
        suffix]`` (no prefix columns when it is held apart) with the padding masked and positions counted over
        real tokens only, so every row sees exactly its own prompt.
        """
        prompts = [r.request.prompt for r in rows]
        unique: dict[tuple[int, ...], int] = {}
        row_to_unique = [unique.setdefault(tuple(p), len(unique)) for p in prompts]
        distinct = list(unique)
        shared = min(len(p) for p in distinct) - 1  # every row keeps at least one token of its own
        first = distinct[0]
        for p in distinct[1:]:
            shared = next((k for k in range(shared) if p[k] != first[k]), shared)
        held: _Prefix | None = None
        cache = _new_cache(self.model.config)
        if self._hold_prefix:
            running = self._running.prefix if self._running is not None else None
            if (running is not None and running.version == self._weights_seen and len(running.ids) <= shared
                    and first[:len(running.ids)] == running.ids):
                held = running
            elif shared >= self.min_shared_prefix:
                held = self._shared_prefix(first[:shared])
            shared = len(held.ids) if held is not None else 0
        elif shared >= self.min_shared_prefix:
            prefix = torch.tensor([first[:shared]], dtype=torch.long, device=self.device)
            cache = self.model(input_ids=prefix, past_key_values=cache, use_cache=True,
                               logits_to_keep=1).past_key_values
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
        if held is not None:  # the prefix is not in the rows: their mask and columns start after it
            mask = own.to(self.device)
            positions = (mask.cumsum(-1) - 1).clamp(min=0) + shared
        else:
            mask = torch.cat([torch.ones((len(distinct), shared), dtype=torch.long), own], dim=1).to(self.device)
            positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, shared:]
        outputs = self._forward(held, input_ids=ids.to(self.device), attention_mask=mask, position_ids=positions,
                                past_key_values=cache, use_cache=True, logits_to_keep=1)
        cache = outputs.past_key_values
        self.counters.prefill_tokens += sum(len(p) - shared for p in distinct)
        logits = outputs.logits[:, -1, :].float()
        if len(distinct) < len(prompts):
            index = torch.tensor(row_to_unique, device=self.device)
            cache.batch_select_indices(index)
            logits, mask, positions = logits[index], mask[index], positions[index]
        return _Running(list(rows), cache, mask, positions[:, -1:], logits, key, held)

    def _shared_prefix(self, ids: Sequence[int]) -> _Prefix:
        """The KV of prefix ``ids`` at batch size 1, computed once while the weights stay the same (the last
        few prefixes are kept: a rollout's later admissions start with the same system prompt)."""
        key = tuple(ids)
        prefix = self._shared.get(key)
        if prefix is None:
            out = self.model(input_ids=torch.tensor([list(key)], dtype=torch.long, device=self.device),
                             past_key_values=_new_cache(self.model.config), use_cache=True, logits_to_keep=1)
            prefix = _Prefix(key, _kv(out.past_key_values), self._weights_seen)
            self.counters.prefill_tokens += len(key)
            self._shared[key] = prefix
            while len(self._shared) > 8:
                self._shared.popitem(last=False)
        self._shared.move_to_end(key)
        return prefix

    def stats(self) -> dict[str, float]:
        return self.counters.as_dict()

    # ------------------------------------------------------------------ weights
    def update_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Copy ``state_dict`` into the model. A no-op when the trainer shares the engine's module."""
        own = self.model.state_dict()
        with torch.no_grad():
            for name, value in state_dict.items():
                target = own.get(name)
                if target is None:
                    raise KeyError(f"update_weights: the engine's model has no parameter {name!r}")
                if target.data_ptr() != value.data_ptr():
                    target.copy_(value.to(target.device, target.dtype))
        self.clear_prefix_cache()


def _main() -> None:  # pragma: no cover - manual tool
    import sys

    engine = HFEngine(sys.argv[1])
    ids = engine.tokenizer(sys.argv[2] if len(sys.argv) > 2 else "Hello")["input_ids"]
    gen = asyncio.run(engine.generate(ids, Sampling(temperature=0.7, max_new_tokens=40)))
    print(engine.tokenizer.decode(gen.token_ids), gen.finish_reason)


if __name__ == "__main__":  # pragma: no cover
    _main()
