"""Simulated environments as pooled resources: ScienceWorld (a JVM per instance) and TextWorld games."""

from agentfly.envs.scienceworld import SCIENCEWORLD, ScienceWorld, scienceworld_tasks, task_names
from agentfly.envs.textgames import TEXTWORLD, TextGame

__all__ = ["SCIENCEWORLD", "TEXTWORLD", "ScienceWorld", "TextGame", "scienceworld_tasks", "task_names"]
