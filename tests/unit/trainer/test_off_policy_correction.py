"""Truncated and masked importance sampling (TIS, MIS) against small examples computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.algorithms import (
    clipped_policy_loss,
    masked_importance_weights,
    off_policy_weights,
    truncated_importance_weights,
)

# Ratios pi_old / pi_behaviour of 1, 3, 0.25, 1.5 and 1.8; position (1, 2) is a tool
# observation (mask 0) with an absurd ratio that must change nothing.
RATIOS = torch.tensor([[1.0, 3.0, 0.25], [1.5, 1.8, 1e30]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
BEHAVIOUR = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, -1.0, -50.0]])
OLD = BEHAVIOUR + RATIOS.log()


def test_tis_truncates_each_tokens_ratio_at_the_cap_and_reports_the_share_truncated() -> None:
    weights, m = truncated_importance_weights(OLD, BEHAVIOUR, MASK, cap=2.0)
    assert torch.allclose(weights, torch.tensor([[1.0, 2.0, 0.25], [1.5, 1.8, 1.0]]))
    assert float(m["off_policy/weight_mean"]) == pytest.approx((1 + 2 + 0.25 + 1.5 + 1.8) / 5)
    assert float(m["off_policy/weight_max"]) == pytest.approx(2.0)
    assert float(m["off_policy/truncated_fraction"]) == pytest.approx(1 / 5)  # only 3.0


def test_mis_masks_out_tokens_whose_ratio_leaves_the_band_and_keeps_the_ratio_inside() -> None:
    weights, m = masked_importance_weights(OLD, BEHAVIOUR, MASK, low=0.5, high=2.0)
    assert torch.allclose(weights, torch.tensor([[1.0, 0.0, 0.0], [1.5, 1.8, 1.0]]))
    assert float(m["off_policy/masked_fraction"]) == pytest.approx(2 / 5)  # 3.0 and 0.25
    assert float(m["off_policy/weight_mean"]) == pytest.approx((1 + 0 + 0 + 1.5 + 1.8) / 5)
    assert float(m["off_policy/weight_max"]) == pytest.approx(1.8)


def test_on_policy_logprobs_give_weight_one_and_the_uncorrected_loss() -> None:
    adv = torch.tensor([[1.0, -1.0, 0.5], [2.0, 0.0, 3.0]])
    plain, _ = clipped_policy_loss(OLD, OLD, adv, MASK)
    for kind in ("tis", "mis"):
        weights, _ = off_policy_weights(kind, OLD, OLD, MASK)
        assert weights is not None and torch.equal(weights, torch.ones_like(weights))
        corrected, _ = clipped_policy_loss(OLD, OLD, adv, MASK, is_weights=weights)
        assert torch.equal(corrected, plain)
    assert off_policy_weights("none", OLD, BEHAVIOUR, MASK) == (None, {})
    with pytest.raises(ValueError, match="Unknown off-policy correction 'is'; use none, tis or mis"):
        off_policy_weights("is", OLD, BEHAVIOUR, MASK)


def test_the_weights_scale_each_tokens_clipped_term_and_carry_no_gradient() -> None:
    # logp = old: ratio 1, no clipping, so token t's loss is -A_t * w_t; token-mean over the 5 mask-1 tokens.
    adv = torch.tensor([[1.0, -1.0, 0.5], [2.0, 4.0, 3.0]])
    logp = OLD.clone().requires_grad_(True)
    weights, _ = truncated_importance_weights(OLD, BEHAVIOUR, MASK, cap=2.0)
    loss, _ = clipped_policy_loss(logp, OLD, adv, MASK, is_weights=weights)
    assert loss.item() == pytest.approx(-(1 * 1 - 1 * 2 + 0.5 * 0.25 + 2 * 1.5 + 4 * 1.8) / 5)
    loss.backward()
    # d loss / d logp_t = -A_t * w_t / 5 (ratio = exp(logp - old) has derivative 1 at logp = old).
    expected = torch.tensor([[-1.0, 2.0, -0.125], [-3.0, -7.2, 0.0]]) / 5
    assert logp.grad is not None and torch.allclose(logp.grad, expected)


def test_the_ratio_of_a_wildly_unlikely_behaviour_token_stays_finite() -> None:
    old, behaviour = torch.tensor([[0.0]]), torch.tensor([[-1000.0]])
    weights, m = masked_importance_weights(old, behaviour, torch.ones(1, 1), low=0.5, high=2.0)
    assert weights.tolist() == [[0.0]] and math.isfinite(float(m["off_policy/weight_mean"]))
    tis, _ = truncated_importance_weights(old, behaviour, torch.ones(1, 1), cap=2.0)
    assert tis.tolist() == [[2.0]]


@pytest.mark.parametrize(("band", "message"), [((1.2, 2.0), r"\[1.2, 2.0\]"), ((0.5, 0.9), r"\[0.5, 0.9\]")])
def test_an_mis_band_that_excludes_the_on_policy_ratio_is_refused(band: tuple[float, float], message: str) -> None:
    with pytest.raises(ValueError, match=f"must hold 1 .*{message}"):
        masked_importance_weights(OLD, BEHAVIOUR, MASK, *band)
