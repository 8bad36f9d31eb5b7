"""ScienceWorld as a task: its task descriptions, 5 variations each, from the split index of
``agentfly.envs.scienceworld`` (no JVM is started to list them). Its demonstrations are the simulator's gold
action sequences, written to a file by ``examples/scienceworld/make_demos.py`` (``sft.demos_path``)."""

from __future__ import annotations

from agentfly.tasks.base import Sample, Task, register

VARIATIONS_PER_TASK = 5


def samples(split: str, n: int, seed: int) -> list[Sample]:
    """Every task of ``split`` with ``VARIATIONS_PER_TASK`` variations drawn by ``seed`` (``n`` is not used)."""
    from agentfly.envs.scienceworld import scienceworld_tasks

    return scienceworld_tasks(split, variations_per_task=VARIATIONS_PER_TASK, seed=seed)


TASK = register(Task(
    name="scienceworld", title="ScienceWorld: act in a simulated lab (built in; needs Java on the workers)",
    samples=samples,
    tools=("agentfly.tools.builtin.scienceworld:sciworld_act", "agentfly.tools.builtin.scienceworld:sciworld_look"),
    reward="agentfly.rewards.builtin.env:env_score"))
