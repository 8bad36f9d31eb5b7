"""REINFORCE++ (Hu 2025, "REINFORCE++: A Simple and Efficient Approach for Aligning Large Language Models"):
token-level returns (the outcome reward at the last token, a per-token KL penalty when KL is applied in the
reward), normalised over the *whole batch* instead of per group (Sec. 3: global advantage normalisation is
less biased than per-prompt normalisation). The ``baseline`` variant (REINFORCE++-baseline, Sec. 4 of v3)
first subtracts each prompt's mean reward, which removes the prompt's difficulty before the global
normalisation.
"""

from __future__ import annotations

import torch

from trainer.algorithms.core import Reduce, group_stats, last_token_index, masked_whiten


def discounted_returns(token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """``G_t = sum_{k >= t, mask_k = 1} gamma^(#mask-1 steps between) r_k`` for each mask-1 position t.

    token_rewards, mask: [B, T] -> [B, T] (0 on mask-0 positions). Mask-0 positions (tool observations in
    between two assistant turns) are not time steps of the policy: the return flows through them unchanged.
    """
    returns = torch.zeros_like(token_rewards, dtype=torch.float32)
    running = torch.zeros(token_rewards.shape[0], device=token_rewards.device)
    m = mask.bool()
    for t in range(token_rewards.shape[1] - 1, -1, -1):
        step = token_rewards[:, t].float() + gamma * running
        running = torch.where(m[:, t], step, running)
        returns[:, t] = torch.where(m[:, t], running, torch.zeros_like(running))
    return returns


def reinforce_pp_advantages(
    token_rewards: torch.Tensor,
    mask: torch.Tensor,
    group_ids: torch.Tensor | None = None,
    *,
    baseline: bool = False,
    gamma: float = 1.0,
    eps: float = 1e-8,
    reduce: Reduce | None = None,
) -> torch.Tensor:
    """Batch-whitened discounted returns. token_rewards, mask: [B, T]; group_ids: [B] -> [B, T].

    With ``baseline=True`` the group mean of the sequence scores is subtracted at each row's last mask-1
    token before the returns are taken (so every token of the row sees ``r_i - mean(r_group)`` plus its KL
    terms); ``group_ids`` is then required.
    """
    rewards = token_rewards.float()
    if baseline:
        if group_ids is None:
            raise ValueError("REINFORCE++ with baseline=True needs group_ids (the prompt of each row)")
        mean, _, _ = group_stats(rewards.sum(-1), group_ids)
        rewards = rewards.clone()
        rows = torch.arange(rewards.shape[0], device=rewards.device)
        rewards[rows, last_token_index(mask)] -= mean
    returns = discounted_returns(rewards, mask, gamma)
    return masked_whiten(returns, mask, eps, reduce)
