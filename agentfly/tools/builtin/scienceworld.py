"""``sciworld_act`` and ``sciworld_look``: act in the rollout's ScienceWorld simulator.

The task comes from the rollout: ``context.info["task"]``/``["variation"]`` when injected, else the task
sample's ``task``/``variation`` fields (see ``agentfly.envs.scienceworld_tasks``). The first call of a rollout
loads it and shows the task and the starting room. Each action stores the environment's score, scaled to
[0, 1], in ``context.info["env_score"]``, which the ``env_score`` reward reads.
"""

from __future__ import annotations

from typing import Any

from agentfly.tools.tool import tool

RESOURCE = "scienceworld"


def episode(context: Any) -> tuple[str, int]:
    """(task, variation) this rollout plays."""
    info, sample = getattr(context, "info", {}) or {}, getattr(context, "sample", {}) or {}
    task = info.get("task", sample.get("task"))
    if not task:
        raise ValueError(
            "this rollout names no ScienceWorld task: give the sample a 'task' field (see "
            "agentfly.envs.scienceworld_tasks) or inject info={'task': ..., 'variation': ...}"
        )
    return str(task), int(info.get("variation", sample.get("variation", 0)))


async def _env(context: Any) -> tuple[Any, str]:
    """The rollout's simulator, with its task loaded; the second value is the intro on first use."""
    env = await context.resource(RESOURCE)
    task, variation = episode(context)
    if env.loaded == (task, variation):
        return env, ""
    first = await env.load(task, variation)
    return env, f"Task: {env.task_description}\n\n{first}\n\n"


def _status(env: Any, context: Any) -> str:
    context.info["env_score"] = env.reward
    done = " The task is complete." if env.done and env.score >= 100 else (" The episode is over." if env.done else "")
    return f"\n(score {env.score:g}/100.{done})"


@tool(resource=RESOURCE, timeout=60)
async def sciworld_act(action: str, context: Any) -> str:
    """Take one action in ScienceWorld and see what happens.

    Args:
        action: A ScienceWorld command, e.g. "look around", "open door to kitchen", "go to kitchen",
            "pick up thermometer", "use thermometer on water", "focus on water", "wait1".
    """
    env, intro = await _env(context)
    observation = await env.act(action)
    return f"{intro}{observation}{_status(env, context)}"


@tool(resource=RESOURCE, timeout=60)
async def sciworld_look(context: Any) -> str:
    """Describe the room you are in and restate the task."""
    env, intro = await _env(context)
    if intro:
        return f"{intro.rstrip()}{_status(env, context)}"
    observation = await env.look()
    return f"Task: {env.task_description}\n\n{observation}{_status(env, context)}"
