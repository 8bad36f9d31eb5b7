"""The process behind one ScienceWorld instance: a JVM (started by the ``scienceworld`` package through
py4j) driven over the worker protocol (``agentfly.resources.backends.worker``).

Run by ``agentfly.envs.scienceworld.ScienceWorld`` as ``python -m agentfly.envs._sciworld_worker``; the JVM
is this process's child and in its process group, so killing the group takes the JVM with it.
"""

from __future__ import annotations

import json
import os
from typing import Any

from agentfly.resources.backends.worker import Channel, die_with_parent, serve


def main() -> None:
    config = json.loads(os.environ.pop("AGENTFLY_SANDBOX", "{}"))
    die_with_parent(config.get("parent_pid"))  # the JVM, in our process group, is swept with us
    channel = Channel()
    try:
        from scienceworld import ScienceWorldEnv

        env = ScienceWorldEnv("", envStepLimit=int(os.environ.get("AGENTFLY_SCIWORLD_STEP_LIMIT", "100")))
    except Exception as exc:  # tell the parent why, instead of dying silently
        channel.write({"ok": False, "ready": False, "error": f"ScienceWorld did not start: {type(exc).__name__}: {exc}"})
        return
    state: dict[str, Any] = {"task": None}

    def load(req: dict[str, Any]) -> dict[str, Any]:
        task, variation = req["task"], int(req.get("variation", 0))
        names = env.get_task_names()
        if task not in names:
            return {"ok": False, "error": f"unknown ScienceWorld task {task!r}; known tasks: {names}"}
        limit = env.get_max_variations(task)
        if not 0 <= variation < limit:
            return {"ok": False, "error": f"task {task!r} has variations 0..{limit - 1}, not {variation}"}
        env.load(task, variation, req.get("simplification", "easy"))
        env.server.reset()
        # A free look (no move spent), not env.reset(): that takes a "look around" step through env.step.
        state["task"] = (task, variation)
        return {"ok": True, "observation": env.look(), "task_description": env.get_task_description(),
                "score": round(100 * env.server.getScore())}

    def step(req: dict[str, Any]) -> dict[str, Any]:
        if state["task"] is None:
            return {"ok": False, "error": "no task loaded; load(task, variation) first"}
        # env.step() would also compute the look, the inventory and every valid action for its info dict,
        # which costs far more than the step itself; ask the simulator for just what a reward needs.
        observation = env.server.step(req["action"])
        score = round(100 * env.server.getScore())
        moves = env.get_num_moves()
        done = bool(env.server.getCompleted()) or moves > env.envStepLimit or score < 0
        return {"ok": True, "observation": observation, "score": score, "done": done, "moves": moves}

    def look(req: dict[str, Any]) -> dict[str, Any]:
        if state["task"] is None:
            return {"ok": False, "error": "no task loaded; load(task, variation) first"}
        return {"ok": True, "observation": env.look(), "task_description": env.get_task_description()}

    def variations(req: dict[str, Any]) -> dict[str, Any]:
        task = req["task"]
        env.load(task, 0, "")
        return {"ok": True, "train": list(env.get_variations_train()), "dev": list(env.get_variations_dev()),
                "test": list(env.get_variations_test())}

    def gold(req: dict[str, Any]) -> dict[str, Any]:
        # The simulator's own solution of this variation (not necessarily the shortest), for demonstrations;
        # it leaves no episode loaded, so a rollout's next action needs its own load.
        env.load(req["task"], int(req["variation"]), req.get("simplification", "easy"), generateGoldPath=True)
        state["task"] = None
        return {"ok": True, "actions": list(env.get_gold_action_sequence()),
                "task_description": env.get_task_description()}

    def tasks(req: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "tasks": list(env.get_task_names())}

    def describe(req: dict[str, Any]) -> dict[str, Any]:
        env.load(req["task"], int(req["variation"]), "")
        return {"ok": True, "task_description": env.get_task_description()}

    def unload(req: dict[str, Any]) -> dict[str, Any]:
        state["task"] = None
        return {"ok": True}

    def ping(req: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "pid": os.getpid(), "tasks": len(env.get_task_names())}

    channel.write({"ok": True, "ready": True, "pid": os.getpid(),
                   "isolation": {"network": "allowed (py4j talks to the JVM over localhost)",
                                 "filesystem": "unrestricted", "workdir": config.get("workdir")}})
    try:
        serve(channel, {"load": load, "step": step, "look": look, "variations": variations, "tasks": tasks,
                        "describe": describe, "gold": gold, "unload": unload, "ping": ping})
    finally:
        env.close()


if __name__ == "__main__":
    main()
