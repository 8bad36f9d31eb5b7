"""Off-policy correction between the policy that sampled the tokens and the one the update starts from.

The rollout engine's logprobs (the *behaviour* policy, ``logp_behaviour``) differ from the trainer's own
(``logp_old``, the policy the PPO ratio is taken against) whenever generation is not the trainer's exact
function: vLLM's kernels and sampler (the logprob mismatch of "Your efficient RL framework secretly brings
you off-policy RL training", Yao, Liu et al. 2025), or a rollout sampled by older weights (asynchronous
training). The policy gradient is then taken on samples of the wrong distribution; an importance weight
``w = pi_old / pi_behaviour`` per token corrects it, bounded so that one token the engine found unlikely cannot
dominate the update:

- TIS (truncated importance sampling, the note above; verl's ``rollout_is`` in ``truncate`` mode):
  ``w = min(exp(logp_old - logp_behaviour), cap)``.
- MIS (masked importance sampling; verl's ``rollout_is`` in ``mask`` mode): ``w = exp(logp_old -
  logp_behaviour)`` inside the band ``[low, high]`` and 0 outside, so tokens whose two policies disagree that
  much are masked out of the gradient (they still count in the loss's denominator, which keeps the loss scale
  and gradient accumulation across micro-batches exact).

Shapes: ``B`` sequences, ``T`` predicted-token positions, as in ``trainer.algorithms.core``. The weights are
constants (no gradient flows through them) multiplying each token's policy-loss term; mask-0 positions get
weight 1 and never count in the metrics.
"""

from __future__ import annotations

from typing import Literal

import torch

from trainer.algorithms.core import masked_mean

OffPolicyCorrection = Literal["none", "tis", "mis"]


def importance_ratio(logp_old: torch.Tensor, logp_behaviour: torch.Tensor) -> torch.Tensor:
    """``exp(logp_old - logp_behaviour)``, the log-ratio clamped to [-20, 20] (no overflow). [B, T] -> [B, T]."""
    return torch.exp((logp_old - logp_behaviour).detach().clamp(-20.0, 20.0))


def _weight_metrics(weights: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    on = mask.bool()
    top = weights[on].max() if bool(on.any()) else torch.ones((), device=weights.device)
    return {"off_policy/weight_mean": masked_mean(weights, mask), "off_policy/weight_max": top}


def truncated_importance_weights(
    logp_old: torch.Tensor, logp_behaviour: torch.Tensor, mask: torch.Tensor, cap: float
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """TIS weights ``min(ratio, cap)``. logp_old, logp_behaviour, mask: [B, T] -> (weights [B, T], metrics).

    Metrics over mask-1 tokens: ``off_policy/weight_mean``, ``off_policy/weight_max`` (after truncation) and
    ``off_policy/truncated_fraction`` (share of tokens whose ratio exceeded the cap).
    """
    if cap <= 0:
        raise ValueError(f"the TIS cap must be > 0 (the note uses 2), got {cap}")
    ratio = importance_ratio(logp_old, logp_behaviour)
    weights = torch.where(mask.bool(), ratio.clamp(max=cap), torch.ones_like(ratio))
    metrics = _weight_metrics(weights, mask)
    metrics["off_policy/truncated_fraction"] = masked_mean((ratio > cap).float(), mask)
    return weights, metrics


def masked_importance_weights(
    logp_old: torch.Tensor, logp_behaviour: torch.Tensor, mask: torch.Tensor, low: float, high: float
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """MIS weights: the ratio where it lies in ``[low, high]``, else 0. [B, T] -> (weights [B, T], metrics).

    Metrics over mask-1 tokens: ``off_policy/weight_mean``, ``off_policy/weight_max`` (of the kept ratios,
    the masked ones counting 0) and ``off_policy/masked_fraction`` (share of tokens outside the band).
    """
    if not 0 <= low <= 1 <= high:
        raise ValueError(f"the MIS band [low, high] must hold 1 (the on-policy ratio), got [{low}, {high}]")
    ratio = importance_ratio(logp_old, logp_behaviour)
    inside = (ratio >= low) & (ratio <= high)
    weights = torch.where(mask.bool(), torch.where(inside, ratio, torch.zeros_like(ratio)), torch.ones_like(ratio))
    metrics = _weight_metrics(weights, mask)
    metrics["off_policy/masked_fraction"] = masked_mean((~inside).float(), mask)
    return weights, metrics


def off_policy_weights(
    kind: str, logp_old: torch.Tensor, logp_behaviour: torch.Tensor, mask: torch.Tensor, *,
    cap: float = 2.0, band: tuple[float, float] = (0.5, 2.0),
) -> tuple[torch.Tensor | None, dict[str, torch.Tensor]]:
    """The correction named by ``algorithm.off_policy_correction``: weights [B, T] and metrics, or
    ``(None, {})`` for ``none`` (the loss is then exactly the uncorrected one)."""
    if kind == "none":
        return None, {}
    if kind == "tis":
        return truncated_importance_weights(logp_old, logp_behaviour, mask, cap)
    if kind == "mis":
        return masked_importance_weights(logp_old, logp_behaviour, mask, band[0], band[1])
    raise ValueError(f"Unknown off-policy correction {kind!r}; use none, tis or mis")
