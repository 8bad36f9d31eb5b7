"""Rewards: ``@reward`` and the ``Reward`` it returns."""

from agentfly.rewards.reward import Reward, RewardError, RewardResult, make_reward, reward

__all__ = ["Reward", "RewardError", "RewardResult", "builtin", "make_reward", "reward"]

from agentfly.rewards import builtin  # builtin rewards use @reward from above
