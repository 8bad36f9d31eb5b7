"""Rewards that ship with AgentFly."""

from agentfly.rewards.builtin.chain import chain_answer
from agentfly.rewards.builtin.code import code_tests
from agentfly.rewards.builtin.env import env_score
from agentfly.rewards.builtin.judge import preference_vs_reference, rubric_judge
from agentfly.rewards.builtin.math import extract_answer, math_equal
from agentfly.rewards.builtin.qa import exact_match, f1
from agentfly.rewards.builtin.repair import repair_tests

__all__ = ["chain_answer", "code_tests", "env_score", "exact_match", "extract_answer", "f1", "math_equal", "preference_vs_reference",
           "repair_tests", "rubric_judge"]
