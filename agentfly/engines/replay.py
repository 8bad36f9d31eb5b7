"""``ReplayEngine``: an engine whose assistant turns are given, not sampled.

It runs written conversations through the exact rollout code path: SFT demonstrations become trajectories
whose loss mask covers the assistant tokens only, logged conversations can be re-scored, and tests can drive
the agent loop with chosen outputs. Each turn's text comes from ``script(prompt_text)``; it is tokenised and
followed by the end-of-turn token, as a model would produce it. With ``model=`` the logprobs are the model's
(teacher forcing, one forward pass per request); otherwise they are 0.0.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, cast

from agentfly.engines.base import Engine, Generation, Sampling

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


class ReplayEngine(Engine):
    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        script: Callable[[str], str],
        *,
        model: PreTrainedModel | None = None,
        max_model_len: int | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.script = script
        self.model = model
        eos = tokenizer.eos_token_id
        if eos is None:
            raise ValueError("ReplayEngine needs a tokenizer with an eos_token (the end-of-turn token)")
        self.stop_token_ids = [int(eos)]
        self.max_model_len = int(max_model_len or getattr(tokenizer, "model_max_length", 4096) or 4096)
        self.model_name = getattr(tokenizer, "name_or_path", None)
        self.counters = {"sequences": 0.0, "generated_tokens": 0.0, "prompt_tokens": 0.0}
        # One forward at a time on the shared model: forwards from several worker threads at once compete for
        # the same intra-op threads, and would race a weight update.
        self._forward = threading.Lock()

    async def generate(self, prompt_ids: Sequence[int], sampling: Sampling) -> Generation:
        # One flat list of ids decodes to one string (transformers types decode for batches too).
        text = self.script(cast(str, self.tokenizer.decode(list(prompt_ids), skip_special_tokens=False)))
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        budget = min(sampling.max_new_tokens, self.max_model_len - len(prompt_ids))
        finish = "stop"
        if len(ids) + 1 > budget:
            ids, finish = ids[: max(budget, 0)], "length"
        else:
            ids.append(self.stop_token_ids[0])
        # The teacher-forced forward runs in a worker thread so tools of other rollouts keep overlapping.
        logprobs = await asyncio.to_thread(self._logprobs, list(prompt_ids), ids, sampling)
        self._count(prompt_ids, ids)
        return Generation(ids, logprobs, finish)  # type: ignore[arg-type]

    def _count(self, prompt_ids: Sequence[int], ids: Sequence[int]) -> None:
        self.counters["sequences"] += 1
        self.counters["prompt_tokens"] += len(prompt_ids)
        self.counters["generated_tokens"] += len(ids)

    def stats(self) -> dict[str, float]:
        return dict(self.counters)

    def _logprobs(self, prompt: list[int], ids: list[int], sampling: Sampling) -> list[float]:
        if self.model is None or not ids:
            return [0.0] * len(ids)
        import torch

        device = next(self.model.parameters()).device
        with self._forward, torch.inference_mode():
            seq = torch.tensor([prompt + ids], device=device)
            logits = self.model(input_ids=seq).logits[0, len(prompt) - 1: -1].float()
            if sampling.temperature > 0:
                logits = logits / sampling.temperature
            logp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids, device=device)[:, None])
        return logp.squeeze(-1).tolist()

    def update_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        if self.model is not None:
            with self._forward:
                self.model.load_state_dict(dict(state_dict), strict=False)

