"""The process behind one TextWorld game instance: compiles games on demand (into a shared cache, one writer
per game file) and plays them, over the worker protocol (``agentfly.resources.backends.worker``).

Run by ``agentfly.envs.textgames.TextGame`` as ``python -m agentfly.envs._textworld_worker``.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from agentfly.resources.backends.worker import Channel, die_with_parent, serve

# The z-machine's status line ("> -= Kitchen =-0/5" padded with spaces) and the opening banner (ASCII art
# drawn with $, |, \, / and _ only) are screen furniture, not text an agent should read.
_FURNITURE = re.compile(r"^\s*>.*$|^[\s$|\\/_>]*[$|\\/_][\s$|\\/_>]*$", re.M)


def clean(text: str) -> str:
    """The game's answer without screen furniture, blank runs collapsed."""
    text = _FURNITURE.sub("", text or "")
    text = re.sub(r"[ \t]+\n", "\n", text)
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def main() -> None:
    config = json.loads(os.environ.pop("AGENTFLY_SANDBOX", "{}"))
    die_with_parent(config.get("parent_pid"))
    channel = Channel()
    try:
        import textworld

        from agentfly.envs.textgames import compile_game
    except Exception as exc:  # tell the parent why, instead of dying silently
        channel.write({"ok": False, "ready": False, "error": f"TextWorld did not start: {type(exc).__name__}: {exc}"})
        return
    infos = textworld.EnvInfos(score=True, max_score=True, won=True, lost=True, objective=True,
                               policy_commands=True, admissible_commands=True)
    state: dict[str, Any] = {"env": None, "game": None}

    def close_env() -> None:
        if state["env"] is not None:
            state["env"].close()
        state["env"], state["game"] = None, None

    def summary(gs: Any, feedback: str) -> dict[str, Any]:
        return {"ok": True, "observation": clean(feedback), "score": int(gs.score or 0), "max_score": int(gs.max_score or 0),
                "won": bool(gs.won), "lost": bool(gs.lost), "moves": int(gs.moves or 0)}

    def load(req: dict[str, Any]) -> dict[str, Any]:
        game = req["game"]
        path = compile_game(game, req["cache_dir"])
        close_env()
        env = textworld.start(str(path), request_infos=infos)
        gs = env.reset()
        state["env"], state["game"] = env, game
        reply = summary(gs, gs.feedback)
        reply["objective"] = gs.objective
        reply["commands"] = list(gs.policy_commands or [])  # the game's own winning commands from the start
        return reply

    def step(req: dict[str, Any]) -> dict[str, Any]:
        if state["env"] is None:
            return {"ok": False, "error": "no game loaded; load(game) first"}
        gs, _, done = state["env"].step(str(req["command"]))
        reply = summary(gs, gs.feedback)
        reply["done"] = bool(done)
        return reply

    def unload(req: dict[str, Any]) -> dict[str, Any]:
        close_env()
        return {"ok": True}

    def ping(req: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "pid": os.getpid()}

    channel.write({"ok": True, "ready": True, "pid": os.getpid(),
                   "isolation": {"network": "none needed", "filesystem": "the game cache", "workdir": config.get("workdir")}})
    try:
        serve(channel, {"load": load, "step": step, "unload": unload, "ping": ping})
    finally:
        close_env()


if __name__ == "__main__":
    main()
