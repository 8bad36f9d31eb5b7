"""DAPO (Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale"). Four changes to
GRPO: clip-higher (separate ``clip_low`` / ``clip_high`` in ``core.clipped_policy_loss``, Sec. 3.1),
dynamic sampling (drop groups whose rewards are all equal, since their advantage is 0 everywhere, and keep
sampling until the batch is full, Sec. 3.2), token-level loss aggregation (``token-mean``, Sec. 3.3), and
overlong reward shaping (a soft length penalty, Sec. 3.4). The advantage is GRPO's.
"""

from __future__ import annotations

import torch

from trainer.algorithms.core import group_stats
from trainer.algorithms.grpo import grpo_advantages

dapo_advantages = grpo_advantages


def informative_groups(scores: torch.Tensor, group_ids: torch.Tensor, tol: float = 1e-6) -> torch.Tensor:
    """Rows whose group has rewards that differ (dynamic sampling keeps only these). [B], [B] -> bool [B]."""
    _, std, count = group_stats(scores, group_ids)
    return (std > tol) & (count > 1)


def overlong_penalty(
    lengths: torch.Tensor, max_length: int, buffer_length: int, penalty: float = 1.0
) -> torch.Tensor:
    """Soft overlong punishment (DAPO eq. 13) added to the reward. lengths: [B] -> [B] (<= 0).

    0 up to ``max_length - buffer_length`` tokens, then falling linearly to ``-penalty`` at ``max_length``
    and staying there beyond it.
    """
    if buffer_length <= 0 or buffer_length > max_length:
        raise ValueError(
            f"overlong buffer_length must be in (0, max_length={max_length}], got {buffer_length}; "
            "set algorithm.overlong_buffer to a fraction of rollout.max_response_tokens"
        )
    expected = max_length - buffer_length
    over = (lengths.float() - expected).clamp(min=0)
    return -(over / buffer_length).clamp(max=1.0) * penalty
