"""Tools that ship with AgentFly."""

from agentfly.tools.builtin.calculator import calculator, evaluate_arithmetic

__all__ = ["calculator", "evaluate_arithmetic"]
