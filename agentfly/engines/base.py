"""The generation-engine interface the rollout layer talks to.

An engine turns a prompt (token ids) into sampled token ids with their logprobs. Rollouts call
``await engine.generate(...)`` concurrently; the engine is free to batch those calls together.
Logprobs are under the sampling distribution before top-p/top-k truncation: ``log_softmax(logits / T)``
(``T = 1`` for greedy decoding), which is what the trainer recomputes for the importance ratio.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class Sampling:
    """How to sample one turn.

    temperature: 0 means greedy decoding.
    top_p: nucleus sampling; 1.0 disables it.
    top_k: keep the k most likely tokens; 0 disables it.
    max_new_tokens: the most tokens one turn may produce.
    stop: strings that end a turn once produced (kept in the output, since the tokens were sampled).
    seed: seeds the sampler of a batch for reproducible rollouts; None draws from torch's global RNG.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 256
    stop: tuple[str, ...] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"Sampling.temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"Sampling.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"Sampling.top_k must be >= 0 (0 = off), got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"Sampling.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if isinstance(self.stop, str) or not isinstance(self.stop, tuple):
            object.__setattr__(self, "stop", (self.stop,) if isinstance(self.stop, str) else tuple(self.stop))

    def replace(self, **changes: Any) -> Sampling:
        from dataclasses import replace

        return replace(self, **changes)


@dataclass
class Generation:
    """One sampled continuation: exactly the tokens the model produced and their logprobs."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    stop_reason: str | int | None = None  # the stop string or token that ended it
    extra: dict[str, Any] = field(default_factory=dict)


class Engine(abc.ABC):
    """A model that samples continuations: the contract between the rollout layer, the trainer and an engine.

    Subclasses: ``HFEngine``, ``VLLMEngine``, ``ReplayEngine``. The rollout layer reads ``tokenizer``,
    ``max_model_len`` and ``stop_token_ids`` and awaits ``generate``; the trainer calls ``update_weights``
    after each update, reports ``stats()`` in every ``resources`` event, and calls ``close()`` at the end.
    """

    tokenizer: PreTrainedTokenizerBase
    max_model_len: int
    stop_token_ids: list[int]  # tokens that end a turn (the chat template's end-of-turn and EOS)
    model_name: str | None = None  # recorded on each trajectory (which model sampled it)

    @abc.abstractmethod
    async def generate(self, prompt_ids: Sequence[int], sampling: Sampling) -> Generation:
        """Sample one continuation of ``prompt_ids``."""

    @abc.abstractmethod
    def update_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Replace the model's weights (after a training step)."""

    @abc.abstractmethod
    def stats(self) -> dict[str, float]:
        """Counters since the engine was built, by name (every engine reports ``sequences`` and
        ``generated_tokens``; the rest are its own, e.g. ``busy_seconds``, ``max_batch``)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Free what the engine holds."""
