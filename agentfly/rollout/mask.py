"""See the loss mask: which tokens are trained (sampled, mask 1) and which are forced (mask 0).

``mask_segments`` gives the decoded spans (the dashboard renders the same spans); ``visualize_mask`` prints
them with trained tokens in green and forced tokens dimmed, so a mask bug is seen, not guessed.
"""

from __future__ import annotations

import functools
import sys
from typing import TYPE_CHECKING, Any, TextIO

from agentfly.rollout.trajectory import Trajectory

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

GREEN, DIM, RESET = "\033[32m", "\033[2m", "\033[0m"


@functools.lru_cache(maxsize=8)
def _load_tokenizer(model: str) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(model)
    return tokenizer


def _tokenizer_for(trajectory: Trajectory, tokenizer: PreTrainedTokenizerBase | None) -> PreTrainedTokenizerBase:
    if tokenizer is not None:
        return tokenizer
    if trajectory.model is None:
        raise ValueError("this trajectory does not name its model; pass tokenizer=")
    return _load_tokenizer(trajectory.model)


def mask_segments(trajectory: Trajectory, tokenizer: PreTrainedTokenizerBase | None = None) -> list[dict[str, Any]]:
    """``[{"start", "end", "mask", "text"}, ...]``: consecutive tokens with the same mask, decoded; without a
    tokenizer, the one of the model the trajectory names."""
    return trajectory.segments(_tokenizer_for(trajectory, tokenizer))


def visualize_mask(trajectory: Trajectory, tokenizer: PreTrainedTokenizerBase | None = None, *, file: TextIO | None = None,
                   color: bool | None = None) -> str:
    """Print the trajectory with trained tokens (mask 1) green and masked tokens (mask 0) dim.

    Without colour (not a terminal, or ``color=False``) trained spans are wrapped in ``[[ ]]``.
    Returns the printed text.
    """
    out = file or sys.stdout
    if color is None:
        color = hasattr(out, "isatty") and out.isatty()
    parts = []
    for seg in mask_segments(trajectory, tokenizer):
        if color:
            parts.append(f"{GREEN if seg['mask'] else DIM}{seg['text']}{RESET}")
        else:
            parts.append(f"[[{seg['text']}]]" if seg["mask"] else seg["text"])
    text = "".join(parts)
    print(text, file=out)
    return text
