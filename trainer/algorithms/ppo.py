"""PPO (Schulman et al. 2017) for language models: a value head on the policy's last hidden state is the
critic, advantages come from GAE (Schulman et al. 2016) over the policy's own tokens, and the critic is
trained with a clipped value loss (``core.clipped_value_loss``).

In a multi-turn trajectory the tool observations are not actions: GAE steps over mask-0 positions as if
they were not there (the value and advantage of the next *policy* token are carried across them), which is
what "the environment answered, then the agent acted again" means.
"""

from __future__ import annotations

import torch
from torch import nn


def gae_advantages(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    *,
    gamma: float = 1.0,
    lam: float = 0.95,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over mask-1 positions. [B, T] x3 -> (advantages, returns), [B, T].

    ``delta_t = r_t + gamma * V_next - V_t`` and ``A_t = delta_t + gamma * lam * A_next``, where "next" is
    the next mask-1 position of the row (0 past the last one: the episode ends there). Returns are
    ``A + V``. Both are 0 on mask-0 positions. Advantages are not whitened here; ``whiten`` in the loop does
    that over the batch, as the PPO baselines do.
    """
    B, T = token_rewards.shape
    m = mask.bool()
    next_value = torch.zeros(B, device=values.device)
    next_adv = torch.zeros(B, device=values.device)
    adv = torch.zeros(B, T, device=values.device)
    for t in range(T - 1, -1, -1):
        v = values[:, t].float()
        delta = token_rewards[:, t].float() + gamma * next_value - v
        a = delta + gamma * lam * next_adv
        next_adv = torch.where(m[:, t], a, next_adv)
        next_value = torch.where(m[:, t], v, next_value)
        adv[:, t] = torch.where(m[:, t], a, torch.zeros_like(a))
    returns = torch.where(m, adv + values.float(), torch.zeros_like(adv))
    return adv, returns


class ValueHead(nn.Module):
    """A linear critic on the policy's hidden states: [B, T, H] -> [B, T]. Starts at 0 so early advantages
    are just the returns."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.proj = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        values: torch.Tensor = self.proj(hidden.to(self.proj.weight.dtype)).squeeze(-1)
        return values
