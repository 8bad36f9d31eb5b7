"""Advantage estimators and policy losses, one module per algorithm, all pure functions of tensors.

``compute_advantages`` is the one place that picks an estimator by name: an explicit branch per algorithm
(no registry), so reading it tells you exactly what each name does.
"""

from __future__ import annotations

import torch

from trainer.algorithms.core import (
    Reduce,
    aggregate_loss,
    clipped_policy_loss,
    clipped_value_loss,
    entropy_from_logits,
    kl_estimate,
    last_token_index,
    masked_mean,
    masked_whiten,
    token_logprobs,
)
from trainer.algorithms.dapo import informative_groups, overlong_penalty
from trainer.algorithms.dr_grpo import dr_grpo_advantages
from trainer.algorithms.grpo import grpo_advantages
from trainer.algorithms.off_policy import (
    masked_importance_weights,
    off_policy_weights,
    truncated_importance_weights,
)
from trainer.algorithms.ppo import ValueHead, gae_advantages
from trainer.algorithms.reinforce_pp import reinforce_pp_advantages
from trainer.algorithms.rloo import rloo_advantages
from trainer.algorithms.turns import (
    discounted_turn_returns,
    step_group_advantages,
    to_tokens,
    turn_advantages,
    turn_gae,
    turn_values_from_tokens,
)

__all__ = [
    "ValueHead",
    "aggregate_loss",
    "clipped_policy_loss",
    "clipped_value_loss",
    "compute_advantages",
    "compute_turn_advantages",
    "dr_grpo_advantages",
    "entropy_from_logits",
    "gae_advantages",
    "grpo_advantages",
    "informative_groups",
    "kl_estimate",
    "masked_importance_weights",
    "masked_mean",
    "masked_whiten",
    "off_policy_weights",
    "outcome_token_rewards",
    "overlong_penalty",
    "reinforce_pp_advantages",
    "rloo_advantages",
    "token_logprobs",
    "truncated_importance_weights",
]


def outcome_token_rewards(
    rewards: torch.Tensor, mask: torch.Tensor, kl: torch.Tensor | None = None, kl_coef: float = 0.0
) -> torch.Tensor:
    """Place each sequence's reward on its last mask-1 token, minus ``kl_coef * kl`` on every mask-1 token
    when KL is applied in the reward (InstructGPT / REINFORCE++). rewards: [B], mask, kl: [B, T] -> [B, T]."""
    token_rewards = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    rows = torch.arange(mask.shape[0], device=mask.device)
    has = mask.sum(-1) > 0
    token_rewards[rows[has], last_token_index(mask)[has]] = rewards.float()[has]
    if kl is not None and kl_coef:
        token_rewards = token_rewards - kl_coef * torch.where(mask.bool(), kl.float(), torch.zeros_like(token_rewards))
    return token_rewards


def compute_advantages(
    name: str,
    token_rewards: torch.Tensor,
    mask: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    values: torch.Tensor | None = None,
    std_normalize: bool = True,
    gamma: float = 1.0,
    lam: float = 0.95,
    whiten: bool = True,
    reduce: Reduce | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Advantages [B, T] (0 on mask-0 tokens) and, for PPO, the critic's returns [B, T] (else None).

    ``reduce`` sums a tensor over data-parallel ranks, for the estimators with whole-batch statistics
    (REINFORCE++, PPO's whitening); the group estimators need none, since a group never straddles ranks."""
    if name == "grpo":
        return grpo_advantages(token_rewards, mask, group_ids, std_normalize=std_normalize), None
    if name == "dapo":
        return grpo_advantages(token_rewards, mask, group_ids, std_normalize=std_normalize), None
    if name == "dr_grpo":
        return dr_grpo_advantages(token_rewards, mask, group_ids), None
    if name == "rloo":
        return rloo_advantages(token_rewards, mask, group_ids), None
    if name == "reinforce_pp":
        return reinforce_pp_advantages(token_rewards, mask, gamma=gamma, reduce=reduce), None
    if name == "reinforce_pp_baseline":
        return reinforce_pp_advantages(token_rewards, mask, group_ids, baseline=True, gamma=gamma,
                                       reduce=reduce), None
    if name == "ppo":
        if values is None:
            raise ValueError("PPO advantages need the critic's values (the value head's output on the batch)")
        adv, returns = gae_advantages(token_rewards, values, mask, gamma=gamma, lam=lam)
        return (masked_whiten(adv, mask, reduce=reduce) if whiten else adv), returns
    raise ValueError(f"Unknown algorithm {name!r}; use grpo, dr_grpo, dapo, rloo, reinforce_pp, "
                     "reinforce_pp_baseline or ppo")


def compute_turn_advantages(
    credit: str,
    turn_rewards: torch.Tensor,
    turn_mask: torch.Tensor,
    turn_of: torch.Tensor,
    mask: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    states: torch.Tensor | None = None,
    values: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 0.95,
    step_weight: float = 1.0,
    whiten: bool = True,
    reduce: Reduce | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Token advantages [B, T] from per-turn rewards (``trainer.algorithms.turns``): every sampled token of
    turn k gets turn k's advantage. turn_rewards, turn_mask, states: [B, K]; turn_of, mask, values: [B, T];
    group_ids: [B]. Returns the critic's per-token returns for ``turn_gae``, else None."""
    if credit == "turn":
        returns = discounted_turn_returns(turn_rewards, turn_mask, gamma)
        return to_tokens(turn_advantages(returns, turn_mask, group_ids), turn_of) * mask, None
    if credit == "step":
        if states is None:
            raise ValueError("credit=step needs each turn's state ids")
        returns = discounted_turn_returns(turn_rewards, turn_mask, gamma)
        episode = rloo_advantages(turn_rewards.sum(-1, keepdim=True), torch.ones_like(group_ids).unsqueeze(1).float(),
                                  group_ids)[:, 0]
        per_turn = step_group_advantages(returns, turn_mask, group_ids, states, episode, step_weight)
        return to_tokens(per_turn, turn_of) * mask, None
    if credit == "turn_gae":
        if values is None:
            raise ValueError("credit=turn_gae needs the critic's values (the value head's output on the batch)")
        turn_values = turn_values_from_tokens(values, turn_of, turn_rewards.shape[1])
        adv, returns = turn_gae(turn_rewards, turn_values, turn_mask, gamma=gamma, lam=lam)
        token_adv = to_tokens(adv, turn_of) * mask
        return (masked_whiten(token_adv, mask, reduce=reduce) if whiten else token_adv), to_tokens(returns, turn_of) * mask
    raise ValueError(f"Unknown credit {credit!r}; use outcome, turn, step or turn_gae")
