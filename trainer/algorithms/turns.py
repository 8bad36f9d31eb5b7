"""Turn-level credit assignment for multi-turn tool use: per-turn rewards, discounted turn returns with a
baseline that keeps the policy gradient unbiased, step-level groups of identical states (GiGPO, Feng et al.
2025, "Group-in-Group Policy Optimization for LLM Agent Training"), and GAE over turns with a critic.

Notation. A batch holds B trajectories; trajectory i has ``n_i`` assistant turns. Tensors over turns are
[B, K] with K = max n_i, and ``turn_mask[i, k] = 1`` for k < n_i. ``turn_rewards[i, k]`` is the reward
credited to turn k (a tool's ``context.reward_turn``, a reward's per-turn scores), with the outcome reward
added on the last turn. The return of turn k is ``G_ik = sum_{j >= k} gamma^(j-k) r_ij``.

Why the baseline is leave-one-out per turn index. The policy gradient of turn k is
``E[grad log pi(a_ik | h_ik) (G_ik - b_ik)]``; it stays unbiased for any ``b_ik`` that does not depend on the
action ``a_ik`` (nor on anything sampled after it) given the history ``h_ik``. The group's other rollouts are
independent draws for the same prompt, so ``b_ik = mean_{j != i, n_j > k} G_jk`` (the other rollouts that
reached turn k) qualifies: ``E[grad log pi(a_ik|h_ik) b_ik | h_ik] = E[b_ik] E[grad log pi(a_ik|h_ik) | h_ik] = 0``.

The obvious alternative, normalising per turn index with the group's mean *and* standard deviation over the
rollouts that reached turn k (``per_turn_index_normalised``), is biased twice over. The mean includes
``G_ik`` itself, so a share ``1/m_k`` of the rollout's own return is subtracted (m_k: rollouts that reached
turn k), and m_k shrinks at later turns, so later turns are damped more than earlier ones; the standard
deviation depends on ``G_ik`` too, and rescales each turn by a different random factor. The test
``test_per_turn_index_normalisation_is_biased_and_the_leave_one_out_baseline_is_not`` computes both expected
gradients exactly on a small two-turn problem and compares them with the true gradient.

Every sampled token of turn k gets turn k's advantage (``to_tokens``); prompt and observation tokens get 0.
"""

from __future__ import annotations

import torch

from trainer.algorithms.core import group_stats


def discounted_turn_returns(turn_rewards: torch.Tensor, turn_mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """``G_ik = r_ik + gamma * G_i(k+1)`` over each row's turns. turn_rewards, turn_mask: [B, K] -> [B, K]
    (0 past a row's last turn)."""
    B, K = turn_rewards.shape
    m = turn_mask.bool()
    returns = torch.zeros(B, K, dtype=torch.float32, device=turn_rewards.device)
    following = torch.zeros(B, dtype=torch.float32, device=turn_rewards.device)
    for k in range(K - 1, -1, -1):
        g = turn_rewards[:, k].float() + gamma * following
        following = torch.where(m[:, k], g, torch.zeros_like(g))
        returns[:, k] = following
    return returns


def _turn_keys(group_ids: torch.Tensor, K: int) -> torch.Tensor:
    """One integer per (group, turn index): [B] -> [B, K]."""
    inverse: torch.Tensor = torch.unique(group_ids, return_inverse=True)[1]
    keys: torch.Tensor = inverse.unsqueeze(1) * K + torch.arange(K, device=group_ids.device).unsqueeze(0)
    return keys


def leave_one_out(values: torch.Tensor, present: torch.Tensor, keys: torch.Tensor, *,
                  alone: str = "zero") -> torch.Tensor:
    """``values - mean(values of the *other* present entries with the same key)``, 0 where absent. An entry
    alone under its key gets 0 (``alone="zero"``) or its own value, a baseline of 0 (``alone="value"``).
    values, present, keys: same shape -> same shape."""
    flat_v, flat_p, flat_k = values.reshape(-1).float(), present.reshape(-1).bool(), keys.reshape(-1)
    out = torch.zeros_like(flat_v)
    idx = flat_p.nonzero().squeeze(1)
    if idx.numel():
        mean, _, count = group_stats(flat_v[idx], flat_k[idx])
        others = (mean * count - flat_v[idx]) / (count - 1).clamp(min=1)
        lone = flat_v[idx] if alone == "value" else torch.zeros_like(others)
        out[idx] = torch.where(count > 1, flat_v[idx] - others, lone)
    return out.reshape(values.shape)


def turn_advantages(returns: torch.Tensor, turn_mask: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """Turn returns minus the leave-one-out mean return of the group's other rollouts at the same turn index
    (unbiased; see the module docstring). returns, turn_mask: [B, K]; group_ids: [B] -> [B, K].

    A turn that no other rollout of its group reached keeps its whole return (a baseline of 0, which is just as
    independent of its action). Giving it 0 instead would drop that turn's gradient exactly when the others
    stopped earlier, an event whose chance differs by turn index: a bias of its own."""
    return leave_one_out(returns, turn_mask, _turn_keys(group_ids, returns.shape[1]), alone="value")


def per_turn_index_normalised(returns: torch.Tensor, turn_mask: torch.Tensor, group_ids: torch.Tensor,
                              eps: float = 1e-6) -> torch.Tensor:
    """``(G_ik - mean_k) / (std_k + eps)`` with the mean and std over the group's rollouts that reached turn k,
    the rollout itself included. [B, K] -> [B, K]. **Biased** (see the module docstring): kept as the reference
    the tests and the guide compare against, not offered as a setting."""
    keys = _turn_keys(group_ids, returns.shape[1])
    m = turn_mask.bool()
    out = torch.zeros_like(returns, dtype=torch.float32)
    mean, std, _ = group_stats(returns[m].float(), keys[m])
    out[m] = (returns[m].float() - mean) / (std + eps)
    return out


def step_group_advantages(returns: torch.Tensor, turn_mask: torch.Tensor, group_ids: torch.Tensor,
                          state_ids: torch.Tensor, episode: torch.Tensor, weight: float = 1.0) -> torch.Tensor:
    """GiGPO's two-level advantage, with leave-one-out baselines at both levels.

    ``A_ik = episode_i + weight * (G_ik - mean G over the group's other turns that acted from the same state)``.
    Turns of one GRPO group whose ``state_ids`` are equal (the same observation, at any turn index) form an
    anchor group; a turn alone in its state gets the episode term only. returns, turn_mask, state_ids: [B, K];
    group_ids, episode (the outcome advantage of each row): [B] -> [B, K].
    """
    K = returns.shape[1]
    _, g = torch.unique(group_ids, return_inverse=True)
    _, s = torch.unique(state_ids, return_inverse=True)
    keys = g.unsqueeze(1) * (int(s.max().item()) + 1 if s.numel() else 1) + s
    step = leave_one_out(returns, turn_mask, keys)
    return torch.where(turn_mask.bool(), episode.float().unsqueeze(1).expand(-1, K) + weight * step,
                       torch.zeros_like(step))


def turn_gae(turn_rewards: torch.Tensor, turn_values: torch.Tensor, turn_mask: torch.Tensor, *,
             gamma: float = 1.0, lam: float = 0.95) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE with one step per turn: ``delta_k = r_k + gamma V_(k+1) - V_k``, ``A_k = delta_k + gamma lam A_(k+1)``
    (0 past the last turn: the episode ends there). turn_rewards, turn_values, turn_mask: [B, K] -> (advantages,
    returns = A + V), both [B, K], 0 past each row's last turn. ``V_k`` is the critic's value where turn k
    starts to be sampled (``turn_values_from_tokens``)."""
    B, K = turn_rewards.shape
    m = turn_mask.bool()
    adv = torch.zeros(B, K, dtype=torch.float32, device=turn_rewards.device)
    next_value = torch.zeros(B, dtype=torch.float32, device=turn_rewards.device)
    next_adv = torch.zeros_like(next_value)
    for k in range(K - 1, -1, -1):
        v = turn_values[:, k].float()
        a = turn_rewards[:, k].float() + gamma * next_value - v + gamma * lam * next_adv
        next_adv = torch.where(m[:, k], a, torch.zeros_like(a))
        next_value = torch.where(m[:, k], v, torch.zeros_like(v))
        adv[:, k] = next_adv
    returns = torch.where(m, adv + turn_values.float(), torch.zeros_like(adv))
    return adv, returns


def to_tokens(per_turn: torch.Tensor, turn_of: torch.Tensor) -> torch.Tensor:
    """Give every sampled token its turn's value. per_turn: [B, K]; turn_of: [B, T] (the turn index of each
    position, -1 on prompt, observation and padding) -> [B, T], 0 where ``turn_of`` is -1."""
    if per_turn.shape[1] == 0:
        return torch.zeros(turn_of.shape, dtype=torch.float32, device=turn_of.device)
    gathered = per_turn.float().gather(1, turn_of.clamp(min=0))
    return torch.where(turn_of >= 0, gathered, torch.zeros_like(gathered))


def turn_values_from_tokens(values: torch.Tensor, turn_of: torch.Tensor, K: int) -> torch.Tensor:
    """The critic's value at the first position of each turn: values, turn_of: [B, T] -> [B, K] (0 for turns a
    row does not have)."""
    B, T = turn_of.shape
    out = torch.zeros(B, K, dtype=torch.float32, device=values.device)
    if K == 0:
        return out
    positions = torch.arange(T, device=turn_of.device).expand(B, T)
    big = torch.full_like(positions, T)
    for k in range(K):
        first = torch.where(turn_of == k, positions, big).min(dim=1).values
        has = first < T
        out[has, k] = values[has, first[has]].float()
    return out
