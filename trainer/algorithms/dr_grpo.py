"""Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training: A Critical Perspective", Sec. 3.1):
GRPO without its two biases. The advantage is only mean-centred in the group (no division by the std, which
over-weights prompts that are nearly always right or wrong), and the loss sums over tokens and divides by a
constant instead of each response's length (``seq-mean-token-sum-norm``), so long wrong answers are not
penalised less per token than short ones.
"""

from __future__ import annotations

import torch

from trainer.algorithms.grpo import grpo_advantages


def dr_grpo_advantages(token_rewards: torch.Tensor, mask: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """``A_i = r_i - mean(r_group)`` on every mask-1 token. token_rewards, mask: [B, T]; group_ids: [B] -> [B, T]."""
    return grpo_advantages(token_rewards, mask, group_ids, std_normalize=False)
