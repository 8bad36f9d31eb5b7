"""Every advantage estimator and loss against a small example computed by hand in the test."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.algorithms import (
    aggregate_loss,
    clipped_policy_loss,
    clipped_value_loss,
    compute_advantages,
    dr_grpo_advantages,
    entropy_from_logits,
    gae_advantages,
    grpo_advantages,
    informative_groups,
    kl_estimate,
    masked_whiten,
    outcome_token_rewards,
    overlong_penalty,
    reinforce_pp_advantages,
    rloo_advantages,
    token_logprobs,
)

torch.set_num_threads(1)

# Two prompts, two responses each. Row 1 has a tool observation in the middle (mask 0 at t=2).
MASK = torch.tensor([[1, 1, 0, 0], [1, 1, 0, 1], [1, 0, 0, 0], [1, 1, 1, 0]])
GROUPS = torch.tensor([0, 0, 1, 1])
REWARDS = torch.tensor([1.0, 0.0, 1.0, 1.0])


def tok(rewards: torch.Tensor = REWARDS) -> torch.Tensor:
    return outcome_token_rewards(rewards, MASK)


def test_outcome_reward_sits_on_the_last_trained_token_only():
    tr = tok(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    assert tr.tolist() == [[0, 1, 0, 0], [0, 0, 0, 2], [3, 0, 0, 0], [0, 0, 4, 0]]


def test_kl_in_reward_subtracts_the_penalty_on_trained_tokens_only():
    kl = torch.full((4, 4), 0.5)
    tr = outcome_token_rewards(torch.zeros(4), MASK, kl, kl_coef=0.1)
    assert torch.allclose(tr, -0.05 * MASK.float())


def test_grpo_normalises_within_each_group_with_the_unbiased_std():
    adv = grpo_advantages(tok(), MASK, GROUPS)
    # Group 0: rewards (1, 0): mean 0.5, unbiased std sqrt(0.5) -> ±0.5/0.7071 = ±0.7071.
    a = 0.5 / math.sqrt(0.5)
    expected = torch.tensor([[a, a, 0, 0], [-a, -a, 0, -a], [0, 0, 0, 0], [0, 0, 0, 0]])
    assert torch.allclose(adv, expected, atol=1e-4)


def test_dr_grpo_only_centres_the_rewards():
    adv = dr_grpo_advantages(tok(torch.tensor([3.0, 1.0, 2.0, 2.0])), MASK, GROUPS)
    assert torch.allclose(adv, torch.tensor([[1.0, 1, 0, 0], [-1, -1, 0, -1], [0, 0, 0, 0], [0, 0, 0, 0]]))


def test_rloo_uses_the_mean_of_the_other_responses_as_baseline():
    groups = torch.tensor([0, 0, 0, 1])
    adv = rloo_advantages(tok(torch.tensor([3.0, 0.0, 0.0, 5.0])), MASK, groups)
    # Row 0: 3 - (0+0)/2 = 3; rows 1, 2: 0 - (3+0)/2 = -1.5; row 3 alone: 0.
    assert torch.allclose(adv[:, 0], torch.tensor([3.0, -1.5, -1.5, 0.0]))
    assert adv[1].tolist() == [-1.5, -1.5, 0.0, -1.5]


def test_reinforce_pp_whitens_returns_over_the_whole_batch():
    adv = reinforce_pp_advantages(tok(), MASK)
    # Returns per trained token (gamma 1): row0 1,1; row1 0,0,0; row2 1; row3 1,1,1 -> 6 ones, 3 zeros.
    mean, std = 6 / 9, math.sqrt(6 / 9 * 3 / 9)
    hi, lo = (1 - mean) / std, (0 - mean) / std
    expected = torch.tensor([[hi, hi, 0, 0], [lo, lo, 0, lo], [hi, 0, 0, 0], [hi, hi, hi, 0]])
    assert torch.allclose(adv, expected, atol=1e-4)


def test_reinforce_pp_baseline_subtracts_the_group_mean_before_whitening():
    adv = reinforce_pp_advantages(tok(), MASK, GROUPS, baseline=True)
    # Centred scores: row0 +0.5, row1 -0.5, rows 2-3: 0. Trained tokens: 0.5 x2, -0.5 x3, 0 x4.
    vals = torch.tensor([0.5, 0.5, -0.5, -0.5, -0.5, 0, 0, 0, 0])
    mean, std = vals.mean(), vals.var(unbiased=False).sqrt()
    assert adv[0, 0].item() == pytest.approx(((0.5 - mean) / std).item(), abs=1e-4)
    assert adv[1, 3].item() == pytest.approx(((-0.5 - mean) / std).item(), abs=1e-4)
    assert adv[2, 0].item() == pytest.approx((-mean / std).item(), abs=1e-4)


def test_reinforce_pp_discounts_across_trained_tokens_and_skips_observations():
    mask = torch.tensor([[1, 0, 1, 1]])
    rewards = outcome_token_rewards(torch.tensor([1.0]), mask)
    from trainer.algorithms.reinforce_pp import discounted_returns

    ret = discounted_returns(rewards, mask, gamma=0.5)
    assert ret.tolist() == [[0.25, 0.0, 0.5, 1.0]]


def test_gae_by_hand_skips_the_observation_token():
    mask = torch.tensor([[1, 0, 1]])
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 9.0, 0.25]])  # the 9.0 on the observation must be ignored
    adv, ret = gae_advantages(rewards, values, mask, gamma=0.9, lam=0.5)
    # t=2 (last): delta = 1 - 0.25 = 0.75, A = 0.75.
    # t=0: next trained token is t=2 -> delta = 0 + 0.9*0.25 - 0.5 = -0.275; A = -0.275 + 0.9*0.5*0.75 = 0.0625.
    assert torch.allclose(adv, torch.tensor([[0.0625, 0.0, 0.75]]))
    assert torch.allclose(ret, torch.tensor([[0.5625, 0.0, 1.0]]))


def test_ppo_advantages_are_whitened_over_trained_tokens():
    values = torch.zeros(4, 4)
    adv, ret = compute_advantages("ppo", tok(), MASK, GROUPS, values=values, lam=1.0)
    assert ret is not None
    trained = adv[MASK.bool()]
    assert trained.mean().abs() < 1e-5 and trained.var(unbiased=False).sub(1).abs() < 1e-3
    assert (adv[~MASK.bool()] == 0).all()


def test_compute_advantages_names_the_choices_for_an_unknown_algorithm():
    with pytest.raises(ValueError, match=r"Unknown algorithm 'ppo2'.*grpo"):
        compute_advantages("ppo2", tok(), MASK, GROUPS)


def test_token_mean_weighs_every_trained_token_equally():
    loss = torch.tensor([[1.0, 3.0, 100.0], [2.0, 100.0, 100.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert aggregate_loss(loss, mask, "token-mean").item() == pytest.approx(2.0)  # (1+3+2)/3
    assert aggregate_loss(loss, mask, "seq-mean-token-mean").item() == pytest.approx(2.0)  # (2 + 2)/2
    assert aggregate_loss(loss, mask, "seq-mean-token-sum").item() == pytest.approx(3.0)  # (4 + 2)/2
    assert aggregate_loss(loss, mask, "seq-mean-token-sum-norm").item() == pytest.approx(1.0)  # 6/(2*3)
    assert aggregate_loss(loss, mask, "seq-mean-token-sum-norm", norm_length=6).item() == pytest.approx(0.5)
    with pytest.raises(ValueError, match="Unknown loss aggregation 'sum'"):
        aggregate_loss(loss, mask, "sum")  # type: ignore[arg-type]


def test_rows_without_trained_tokens_do_not_count_in_sequence_means():
    loss = torch.tensor([[2.0, 4.0], [7.0, 7.0]])
    mask = torch.tensor([[1, 1], [0, 0]])
    assert aggregate_loss(loss, mask, "seq-mean-token-mean").item() == pytest.approx(3.0)


def test_clipped_loss_by_hand_with_clip_higher():
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.1, 1.0]]))
    old = torch.zeros(1, 4)
    adv = torch.tensor([[1.0, -1.0, -2.0, 5.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    loss, m = clipped_policy_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.28)
    # t0: ratio 1.5, A=1 -> max(-1.5, -1.28) = -1.28 (clipped high); t1: ratio 0.5, A=-1 -> max(0.5, 0.8) = 0.8
    # (clipped low); t2: ratio 1.1, A=-2 -> max(2.2, 2.2) = 2.2. t3 masked.
    assert loss.item() == pytest.approx((-1.28 + 0.8 + 2.2) / 3, abs=1e-5)
    assert m["clip_fraction"].item() == pytest.approx(2 / 3)


def test_dual_clip_caps_the_loss_of_negative_advantages():
    logp = torch.log(torch.tensor([[10.0]]))
    loss, _ = clipped_policy_loss(logp, torch.zeros(1, 1), torch.tensor([[-1.0]]), torch.ones(1, 1), dual_clip=3.0)
    assert loss.item() == pytest.approx(3.0)


def test_value_loss_takes_the_larger_of_clipped_and_unclipped_error():
    values = torch.tensor([[1.0, 0.0]])
    old = torch.tensor([[0.0, 0.0]])
    returns = torch.tensor([[2.0, 1.0]])
    loss, m = clipped_value_loss(values, old, returns, torch.tensor([[1, 1]]), clip=0.2)
    # t0: unclipped (1-2)^2 = 1, clipped V=0.2 -> (0.2-2)^2 = 3.24 -> 3.24; t1: 1 and 1 -> 1. 0.5 * mean = 1.06
    assert loss.item() == pytest.approx(0.5 * (3.24 + 1) / 2)
    assert m["value_clip_fraction"].item() == pytest.approx(0.5)


def test_kl_estimators_by_hand():
    logp, ref = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])
    lr = math.log(0.5)  # log(ref/p)
    assert kl_estimate(logp, ref, "k1").item() == pytest.approx(-lr)
    assert kl_estimate(logp, ref, "k2").item() == pytest.approx(0.5 * lr * lr)
    assert kl_estimate(logp, ref, "k3").item() == pytest.approx(0.5 - 1 - lr)
    with pytest.raises(ValueError, match="k4"):
        kl_estimate(logp, ref, "k4")  # type: ignore[arg-type]


def test_entropy_of_a_uniform_distribution_is_log_vocab():
    assert entropy_from_logits(torch.zeros(1, 1, 8)).item() == pytest.approx(math.log(8))


def test_token_logprobs_match_log_softmax_at_the_temperature():
    logits = torch.randn(2, 3, 5)
    targets = torch.randint(0, 5, (2, 3))
    want = torch.log_softmax(logits / 0.7, -1).gather(-1, targets[..., None]).squeeze(-1)
    assert torch.allclose(token_logprobs(logits, targets, 0.7), want, atol=1e-5)


def test_masked_whiten_ignores_masked_values_even_when_they_are_nan():
    x = torch.tensor([[1.0, float("nan")], [3.0, 5.0]])
    mask = torch.tensor([[1, 0], [1, 1]])
    out = masked_whiten(x, mask)
    assert out[0, 1] == 0 and torch.isfinite(out).all()
    assert out[mask.bool()].mean().abs() < 1e-6


def test_dynamic_sampling_keeps_only_groups_whose_rewards_differ():
    scores = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0])
    groups = torch.tensor([0, 0, 1, 1, 2, 2])
    assert informative_groups(scores, groups).tolist() == [False, False, True, True, False, False]


def test_overlong_penalty_is_linear_inside_the_buffer():
    lengths = torch.tensor([10, 16, 18, 20, 30])
    assert overlong_penalty(lengths, max_length=20, buffer_length=4, penalty=1.0).tolist() == [
        0.0, 0.0, -0.5, -1.0, -1.0]
    with pytest.raises(ValueError, match="overlong_buffer"):
        overlong_penalty(lengths, max_length=20, buffer_length=0)


def test_observation_tokens_get_exactly_zero_gradient():
    """Perturb logprobs and advantages on mask-0 tokens (even to NaN): loss and gradients do not change."""
    torch.manual_seed(0)
    mask = torch.tensor([[1, 1, 0, 0, 1], [0, 1, 1, 0, 0]])
    adv = torch.randn(2, 5)
    old = torch.randn(2, 5) * 0.1 - 1.0
    for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"):
        logp = (torch.randn(2, 5) * 0.1 - 1.0).requires_grad_()
        loss, _ = clipped_policy_loss(logp, old, adv, mask, agg=agg)
        kl = masked_whiten(kl_estimate(logp, old, "k3"), mask).sum()
        (loss + kl).backward()
        assert logp.grad is not None
        assert (logp.grad[~mask.bool()] == 0).all()
        assert (logp.grad[mask.bool()] != 0).any()
        perturbed = logp.detach().clone()
        perturbed[~mask.bool()] = float("nan")
        adv2 = adv.clone()
        adv2[~mask.bool()] = 1e6
        loss2, _ = clipped_policy_loss(perturbed, old, adv2, mask, agg=agg)
        assert loss2.item() == pytest.approx(loss.item())
