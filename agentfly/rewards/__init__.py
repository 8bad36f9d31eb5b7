"""Rewards: ``@reward`` and the ``Reward`` it returns."""

from agentfly.rewards.reward import Reward, RewardError, RewardResult, make_reward, reward

__all__ = ["Reward", "RewardError", "RewardResult", "make_reward", "reward"]
