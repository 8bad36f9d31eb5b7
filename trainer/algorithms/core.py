"""The pieces every algorithm shares, as pure functions of tensors.

Shapes: ``B`` sequences, ``T`` token positions. Per-token tensors are aligned to *predicted* tokens: position
``t`` holds the logprob of token ``t + 1`` of the sequence (the trainer shifts once, in ``trainer.batch.collate``).
``mask`` is the trajectory's ``loss_mask`` shifted the same way: 1 where the engine sampled the token, 0 for
prompt, tool observations, template glue and padding. Nothing here ever lets a mask-0 position reach a loss:
masked values are selected with ``torch.where`` (not multiplied), so even a NaN or an infinity there cannot
leak into the gradient.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch

LossAgg = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
KLEstimator = Literal["k1", "k2", "k3"]


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``x`` where ``mask`` is 1. x, mask: [B, T] -> scalar, or [B] with ``dim=-1``."""
    picked = torch.where(mask.bool(), x, torch.zeros((), dtype=x.dtype, device=x.device))
    return picked.sum() if dim is None else picked.sum(dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``x`` over mask-1 positions (0 where there are none). x, mask: [B, T] -> scalar or [B]."""
    count = mask.sum() if dim is None else mask.sum(dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1).to(x.dtype)


Reduce = Callable[[torch.Tensor], torch.Tensor]


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8, reduce: Reduce | None = None
                  ) -> torch.Tensor:
    """``(x - mean) / std`` with the statistics over mask-1 positions only; mask-0 positions become 0.

    x, mask: [B, T] -> [B, T]. The std is the population std (divide by n), as the REINFORCE++ paper's
    batch normalisation of advantages. ``reduce`` sums a tensor over data-parallel ranks (``None``: one
    process): the statistics are then those of the whole batch, as sums and counts, not a mean of means.
    """
    if reduce is None:
        mean = masked_mean(x, mask)
        var = masked_mean((x - mean) ** 2, mask)
    else:
        total = reduce(torch.stack([masked_sum(x, mask).double(), mask.sum().double()]))
        count = total[1].clamp(min=1)
        mean = (total[0] / count).to(x.dtype)
        var = (reduce(masked_sum((x - mean) ** 2, mask).double()) / count).to(x.dtype)
    out = (x - mean) * torch.rsqrt(var + eps)
    return torch.where(mask.bool(), out, torch.zeros_like(out))


def aggregate_loss(
    loss: torch.Tensor, mask: torch.Tensor, mode: LossAgg, norm_length: int | None = None
) -> torch.Tensor:
    """Reduce a per-token loss to a scalar over mask-1 tokens. loss, mask: [B, T] -> scalar.

    - ``token-mean``: every trained token in the batch weighs the same (DAPO, Sec. 3.3): long answers are not
      diluted, which is what keeps long, wrong responses from slipping through.
    - ``seq-mean-token-mean``: mean over each sequence, then over sequences (the original GRPO objective);
      this favours short correct answers and long wrong ones (the length bias Dr. GRPO points out).
    - ``seq-mean-token-sum``: sum over each sequence, mean over sequences.
    - ``seq-mean-token-sum-norm``: the sum over all tokens divided by ``B * norm_length``, a constant
      (Dr. GRPO, Sec. 3.1): no per-sequence length normalisation at all. ``norm_length`` defaults to ``T``.

    Sequences without any mask-1 token count in neither mean (they carry no signal).
    """
    if mode == "token-mean":
        return masked_mean(loss, mask)
    seq_tokens = mask.sum(-1)
    has_tokens = seq_tokens > 0
    n_seq = has_tokens.sum().clamp(min=1).to(loss.dtype)
    if mode == "seq-mean-token-sum":
        return masked_sum(loss, mask, dim=-1).sum() / n_seq
    if mode == "seq-mean-token-mean":
        return masked_mean(loss, mask, dim=-1).sum() / n_seq
    if mode == "seq-mean-token-sum-norm":
        length = norm_length if norm_length is not None else loss.shape[-1]
        return masked_sum(loss, mask) / (loss.shape[0] * length)
    raise ValueError(
        f"Unknown loss aggregation {mode!r}; use token-mean, seq-mean-token-sum, seq-mean-token-mean "
        "or seq-mean-token-sum-norm"
    )


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, kind: KLEstimator) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from samples of the policy. [B, T] -> [B, T].

    With ``log r = ref_logp - logp`` (Schulman, "Approximating KL divergence", 2020):
    - ``k1 = -log r``: unbiased, high variance, can be negative.
    - ``k2 = (log r)^2 / 2``: biased, low variance, always >= 0.
    - ``k3 = (r - 1) - log r``: unbiased and always >= 0 (the GRPO paper's choice). The log-ratio is clamped
      to [-20, 20] so one very unlikely token cannot overflow ``exp``.
    """
    log_ratio = ref_logp - logp
    if kind == "k1":
        return -log_ratio
    if kind == "k2":
        return 0.5 * log_ratio.square()
    if kind == "k3":
        log_ratio = log_ratio.clamp(-20.0, 20.0)
        return torch.exp(log_ratio) - 1.0 - log_ratio
    raise ValueError(f"Unknown KL estimator {kind!r}; use k1, k2 or k3")


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the categorical distribution at each position. logits: [B, T, V] -> [B, T]."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Logprob of each target token under ``softmax(logits / temperature)``.

    logits: [B, T, V], targets: [B, T] -> [B, T]. Dividing by the sampling temperature makes these the same
    quantity the engine reports (``agentfly.engines.base``), so the importance ratio compares like with like.
    """
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    # log_softmax(x)[y] = x[y] - logsumexp(x): avoids materialising a second [B, T, V] tensor.
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def clipped_policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    agg: LossAgg = "token-mean",
    norm_length: int | None = None,
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The PPO clipped surrogate, negated to a loss, over mask-1 tokens.

    logp, old_logp, advantages, mask: [B, T] -> (scalar loss, metrics).

    ``ratio = exp(logp - old_logp)`` is clipped to ``[1 - clip_low, 1 + clip_high]``; separate bounds are
    DAPO's clip-higher (Sec. 3.1: a larger upper bound lets unlikely tokens grow, against entropy collapse).
    ``dual_clip`` (Ye et al. 2020, "dual-clip PPO") caps the loss of negative-advantage tokens at
    ``-dual_clip * A`` so a huge ratio cannot blow up the update. Metrics: ``clip_fraction`` (share of
    mask-1 tokens whose gradient the clip removed), ``approx_kl`` (k3 between old and new policy), ``ratio``.
    ``is_weights`` [B, T]: off-policy importance weights (``trainer.algorithms.off_policy``), constants that
    multiply each token's term (Yao et al. 2025, eq. 3: TIS applied to the clipped surrogate).
    """
    log_ratio = (logp - old_logp).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1 (it bounds the loss at -dual_clip * A), got {dual_clip}")
        capped = torch.minimum(per_token, -advantages * dual_clip)
        per_token = torch.where(advantages < 0, capped, per_token)
    if is_weights is not None:
        per_token = per_token * is_weights.detach()
    loss = aggregate_loss(per_token, mask, agg, norm_length)
    with torch.no_grad():
        metrics = {
            "clip_fraction": masked_mean((clipped > unclipped).float(), mask),
            "approx_kl": masked_mean(ratio - 1.0 - log_ratio, mask),
            "ratio": masked_mean(ratio, mask),
        }
    return loss, metrics


def clipped_value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip: float | None = 0.2,
    agg: LossAgg = "token-mean",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Critic loss ``0.5 * max((V - R)^2, (clip(V, V_old ± clip) - R)^2)`` over mask-1 tokens.

    values, old_values, returns, mask: [B, T] -> (scalar loss, metrics). Value clipping keeps the critic
    from moving further than the policy's trust region per update (PPO2 baselines; CleanRL ``clip_vloss``);
    ``clip=None`` turns it off. Metric ``value_clip_fraction``: share of tokens where the clipped term won.
    """
    unclipped = (values - returns).square()
    if clip is None:
        per_token = unclipped
        frac = torch.zeros((), device=values.device)
    else:
        v_clipped = old_values + (values - old_values).clamp(-clip, clip)
        clipped = (v_clipped - returns).square()
        per_token = torch.maximum(unclipped, clipped)
        frac = masked_mean((clipped > unclipped).float(), mask).detach()
    return 0.5 * aggregate_loss(per_token, mask, agg), {"value_clip_fraction": frac}


def last_token_index(mask: torch.Tensor) -> torch.Tensor:
    """Index of the last mask-1 position of each row (0 for rows without any). mask: [B, T] -> [B]."""
    positions = torch.arange(mask.shape[-1], device=mask.device).expand_as(mask)
    return torch.where(mask.bool(), positions, torch.zeros_like(positions)).max(-1).values


def broadcast_to_tokens(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """One score per sequence onto each of its mask-1 tokens. scores: [B], mask: [B, T] -> [B, T]."""
    return torch.where(mask.bool(), scores.unsqueeze(-1).to(torch.float32), torch.zeros((), device=mask.device))


def group_stats(values: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row mean, unbiased std and size of the row's group. values, group_ids: [B] -> three [B] tensors.

    ``group_ids`` are arbitrary integers; rows with equal ids form a group (the ``group_size`` rollouts of
    one prompt). A group of one has std 0.
    """
    _, inverse = torch.unique(group_ids, return_inverse=True)
    n_groups = int(inverse.max().item()) + 1 if inverse.numel() else 0
    values = values.to(torch.float32)
    count = torch.zeros(n_groups, device=values.device).index_add_(0, inverse, torch.ones_like(values))
    total = torch.zeros(n_groups, device=values.device).index_add_(0, inverse, values)
    mean = total / count
    sq = torch.zeros(n_groups, device=values.device).index_add_(0, inverse, (values - mean[inverse]) ** 2)
    std = torch.sqrt(sq / (count - 1).clamp(min=1))
    return mean[inverse], std[inverse], count[inverse]
