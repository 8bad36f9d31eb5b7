"""Tools that ship with AgentFly."""

from agentfly.tools.builtin.calculator import calculator, evaluate_arithmetic
from agentfly.tools.builtin.lookup import lookup
from agentfly.tools.builtin.python_code import python_code
from agentfly.tools.builtin.scienceworld import sciworld_act, sciworld_look
from agentfly.tools.builtin.search import search
from agentfly.tools.builtin.textworld import tw_act
from agentfly.tools.builtin.workspace import apply_patch, bash, read_file, run_tests, write_file

__all__ = ["apply_patch", "bash", "calculator", "evaluate_arithmetic", "lookup", "python_code", "read_file", "run_tests",
           "sciworld_act", "sciworld_look", "search", "tw_act", "write_file"]
