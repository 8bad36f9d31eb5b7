"""Rewards that ship with AgentFly."""

from agentfly.rewards.builtin.math import extract_answer, math_equal

__all__ = ["extract_answer", "math_equal"]
