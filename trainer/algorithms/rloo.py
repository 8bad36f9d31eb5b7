"""RLOO (Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style Optimization", Sec. 3.2;
Kool et al. 2019): each response's baseline is the mean reward of the *other* responses to the same prompt,
which keeps the estimator unbiased (the baseline does not depend on the response itself).
"""

from __future__ import annotations

import torch

from trainer.algorithms.core import broadcast_to_tokens, group_stats


def rloo_advantages(token_rewards: torch.Tensor, mask: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """``A_i = r_i - (sum_group r - r_i) / (n - 1)`` on every mask-1 token.

    token_rewards, mask: [B, T]; group_ids: [B] -> [B, T]. Equivalently ``n / (n - 1) * (r_i - mean)``.
    A group of one has no other response to compare with and gets advantage 0.
    """
    scores = token_rewards.sum(-1).to(torch.float32)
    mean, _, count = group_stats(scores, group_ids)
    others = (mean * count - scores) / (count - 1).clamp(min=1)
    adv = torch.where(count > 1, scores - others, torch.zeros_like(scores))
    return broadcast_to_tokens(adv, mask)
