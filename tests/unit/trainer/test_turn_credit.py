"""Turn-level credit: each estimator on hand-computed examples, and an exact check of which baselines keep the
policy gradient unbiased on a small two-turn problem."""

from __future__ import annotations

import itertools

import pytest
import torch

from trainer.algorithms.turns import (
    discounted_turn_returns,
    per_turn_index_normalised,
    step_group_advantages,
    to_tokens,
    turn_advantages,
    turn_gae,
    turn_values_from_tokens,
)


def t(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def test_discounted_turn_returns_sum_each_rows_later_turn_rewards_and_stop_at_its_last_turn() -> None:
    rewards, mask = t([[1, 0, 2], [0.5, 1, 0]]), t([[1, 1, 1], [1, 1, 0]])
    torch.testing.assert_close(discounted_turn_returns(rewards, mask, gamma=0.5), t([[1.5, 1, 2], [1, 1, 0]]))


def test_turn_advantages_subtract_the_other_rollouts_mean_return_at_the_same_turn_index() -> None:
    returns = t([[1, 4, 5], [2, 6, 0], [3, 0, 0], [7, 8, 0]])
    mask = t([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 0]])
    groups = torch.tensor([0, 0, 0, 1])
    expected = t([
        [1 - (2 + 3) / 2, 4 - 6, 5],  # turn 2: no other rollout got there, so the baseline is 0
        [2 - (1 + 3) / 2, 6 - 4, 0],
        [3 - (1 + 2) / 2, 0, 0],
        [7, 8, 0],  # alone in its group
    ])
    torch.testing.assert_close(turn_advantages(returns, mask, groups), expected)


def test_step_groups_add_the_leave_one_out_advantage_among_turns_that_acted_from_the_same_state() -> None:
    returns = t([[3, 2], [1, 4], [5, 0]])
    mask = t([[1, 1], [1, 1], [1, 0]])
    states = torch.tensor([[0, 7], [0, 7], [0, 9]])  # every turn 0 from the prompt; turns 1 of rows 0, 1 alike
    episode = torch.tensor([0.5, -0.5, 1.0])
    out = step_group_advantages(returns, mask, torch.tensor([0, 0, 0]), states, episode, weight=0.5)
    expected = t([
        [0.5 + 0.5 * (3 - 3), 0.5 + 0.5 * (2 - 4)],
        [-0.5 + 0.5 * (1 - 4), -0.5 + 0.5 * (4 - 2)],
        [1.0 + 0.5 * (5 - 2), 0],
    ])
    torch.testing.assert_close(out, expected)


def test_states_of_different_groups_never_share_a_step_group() -> None:
    out = step_group_advantages(t([[1], [3]]), t([[1], [1]]), torch.tensor([0, 1]), torch.tensor([[4], [4]]),
                                torch.zeros(2))
    torch.testing.assert_close(out, t([[0], [0]]))


def test_turn_gae_is_the_return_minus_the_value_at_lambda_one_and_one_step_td_at_lambda_zero() -> None:
    rewards, values, mask = t([[0, 0, 1], [0, 1, 0]]), t([[0.2, 0.4, 0.6], [0.5, 0.3, 9]]), t([[1, 1, 1], [1, 1, 0]])
    adv, returns = turn_gae(rewards, values, mask, gamma=1.0, lam=1.0)
    torch.testing.assert_close(adv, t([[0.8, 0.6, 0.4], [0.5, 0.7, 0]]))
    torch.testing.assert_close(returns, t([[1, 1, 1], [1, 1, 0]]))
    adv0, _ = turn_gae(rewards, values, mask, gamma=0.9, lam=0.0)
    torch.testing.assert_close(adv0, t([[0.9 * 0.4 - 0.2, 0.9 * 0.6 - 0.4, 1 - 0.6], [0.9 * 0.3 - 0.5, 1 - 0.3, 0]]))


def test_every_sampled_token_of_a_turn_gets_that_turns_value_and_prompt_and_observations_get_zero() -> None:
    turn_of = torch.tensor([[-1, 0, 0, -1, 1, 1], [-1, -1, 0, -1, -1, -1]])
    per_turn = t([[2, 3], [5, 0]])
    torch.testing.assert_close(to_tokens(per_turn, turn_of), t([[0, 2, 2, 0, 3, 3], [0, 0, 5, 0, 0, 0]]))
    values = t([[9, 1, 8, 9, 4, 7], [9, 9, 6, 9, 9, 9]])
    torch.testing.assert_close(turn_values_from_tokens(values, turn_of, 2), t([[1, 4], [6, 0]]))


# ---------------------------------------------------------------------------------------- bias, exactly
# A two-turn problem with a tabular policy. Turn 0: stop (reward 0.5, the episode ends) or go on. Turn 1, only
# after going on: succeed (reward 1) or fail (0). J = (1 - p) * 0.5 + p * q with p = sigmoid(theta_0), q =
# sigmoid(theta_1). Rollouts end after one or two turns, so later turns are reached by fewer rollouts of a
# group: exactly where per-turn-index normalisation goes wrong.
OUTCOMES = [(0,), (1, 0), (1, 1)]  # actions per turn


def _expected_gradient(estimator: str, theta: torch.Tensor, n: int) -> torch.Tensor:
    """E over every group of n rollouts of ``1/n sum_i sum_k grad log pi(a_ik) A_ik``, enumerated exactly."""
    p, q = torch.sigmoid(theta)
    total = torch.zeros(2)
    for group in itertools.product(OUTCOMES, repeat=n):
        prob = torch.tensor(1.0)
        rewards = torch.zeros(n, 2)
        mask = torch.zeros(n, 2)
        for i, actions in enumerate(group):
            prob = prob * (p if actions[0] else 1 - p)
            mask[i, 0] = 1
            if actions[0] == 0:
                rewards[i, 0] = 0.5
            else:
                prob = prob * (q if actions[1] else 1 - q)
                mask[i, 1] = 1
                rewards[i, 1] = float(actions[1])
        returns = discounted_turn_returns(rewards, mask)
        groups = torch.zeros(n, dtype=torch.long)
        if estimator == "leave_one_out":
            adv = turn_advantages(returns, mask, groups)
        else:
            adv = per_turn_index_normalised(returns, mask, groups)
        th = theta.clone().requires_grad_(True)
        pp, qq = torch.sigmoid(th)
        surrogate = torch.tensor(0.0)
        for i, actions in enumerate(group):
            logp0 = torch.log(pp if actions[0] else 1 - pp)
            surrogate = surrogate + logp0 * adv[i, 0]
            if actions[0]:
                surrogate = surrogate + torch.log(qq if actions[1] else 1 - qq) * adv[i, 1]
        (grad,) = torch.autograd.grad(surrogate / n, th)
        total += prob.detach() * grad
    return total


def test_per_turn_index_normalisation_is_biased_and_the_leave_one_out_baseline_is_not() -> None:
    theta = torch.tensor([0.3, -0.4], dtype=torch.float64).float()
    p, q = torch.sigmoid(theta)
    true = torch.stack([(q - 0.5) * p * (1 - p), p * q * (1 - q)])  # dJ/dtheta by hand
    unbiased = _expected_gradient("leave_one_out", theta, n=3)
    torch.testing.assert_close(unbiased, true, rtol=1e-5, atol=1e-6)
    normalised = _expected_gradient("per_turn_index", theta, n=3)
    # Not a rescaling of the true gradient either: its direction is off, so no learning rate can fix it.
    cosine = torch.nn.functional.cosine_similarity(normalised, true, dim=0)
    assert float(cosine) < 0.99
    # Here it weighs the second turn a third as much, relative to the first, as the true gradient does.
    assert float(normalised[1] / normalised[0]) == pytest.approx(-1.80, abs=0.01)
    assert float(true[1] / true[0]) == pytest.approx(-5.72, abs=0.01)


def test_turn_layout_places_turn_rewards_and_the_outcome_on_each_rows_turns_and_sampled_positions() -> None:
    from agentfly.rollout import Trajectory, Turn, TurnReward
    from trainer.batch import turn_layout

    a = Trajectory(sample={}, rollout_id="a", group_id="g", token_ids=[1, 2, 3, 4, 5, 6, 7],
                   loss_mask=[0, 0, 1, 1, 0, 1, 1])
    a.turns = [Turn(0, 2, 4, "", "stop", state=""), Turn(1, 5, 7, "", "stop", state="s1")]
    a.turn_rewards = [TurnReward(0, 0.5, "hop"), TurnReward(0, 0.25, "hop"), TurnReward(1, -0.1, "late")]
    b = Trajectory(sample={}, rollout_id="b", group_id="g", token_ids=[1, 2, 3], loss_mask=[0, 0, 1])
    b.turns = [Turn(0, 2, 3, "", "stop", state="")]
    layout = turn_layout([a, b], torch.tensor([1.0, 0.0]), width=6)
    torch.testing.assert_close(layout.rewards, t([[0.75, 0.9], [0.0, 0.0]]))
    torch.testing.assert_close(layout.mask, t([[1, 1], [1, 0]]))
    assert layout.states.tolist() == [[0, 1], [0, -1]]
    # Position p predicts token p + 1: turn 0 of ``a`` is tokens 2-3, so positions 1-2.
    assert layout.turn_of.tolist() == [[-1, 0, 0, -1, 1, 1], [-1, 0, -1, -1, -1, -1]]
    kl = torch.ones(2, 6)
    penalised = turn_layout([a, b], torch.tensor([1.0, 0.0]), width=6, kl_reward=kl, kl_coef=0.1)
    torch.testing.assert_close(penalised.rewards, t([[0.75 - 0.2, 0.9 - 0.2], [-0.1, 0.0]]))
