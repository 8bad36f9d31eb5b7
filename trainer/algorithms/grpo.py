"""GRPO (Shao et al. 2024, "DeepSeekMath", Sec. 4.1): the advantage of a response is its reward normalised
within the group of responses to the same prompt; no critic. The policy loss is the clipped surrogate of
``core.clipped_policy_loss``; the original objective aggregates ``seq-mean-token-mean`` and puts a k3 KL to
the reference in the loss.
"""

from __future__ import annotations

import torch

from trainer.algorithms.core import broadcast_to_tokens, group_stats


def grpo_advantages(
    token_rewards: torch.Tensor,
    mask: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    std_normalize: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """``A_i = (r_i - mean(r_group)) / (std(r_group) + eps)`` on every mask-1 token of response i.

    token_rewards, mask: [B, T]; group_ids: [B] -> advantages [B, T]. The score ``r_i`` is the sum of the
    row's token rewards (the outcome reward, minus a KL penalty when KL is applied in the reward). The std is
    the unbiased group std. ``std_normalize=False`` gives Dr. GRPO's mean-centred advantage.
    """
    scores = token_rewards.sum(-1)
    mean, std, _ = group_stats(scores, group_ids)
    adv = scores - mean
    if std_normalize:
        adv = adv / (std + eps)
    return broadcast_to_tokens(adv, mask)
