"""Environments as pooled resources: ScienceWorld (a JVM text simulator) and its task set."""

from agentfly.envs.scienceworld import SCIENCEWORLD, ScienceWorld, scienceworld_tasks, task_names

__all__ = ["SCIENCEWORLD", "ScienceWorld", "scienceworld_tasks", "task_names"]
