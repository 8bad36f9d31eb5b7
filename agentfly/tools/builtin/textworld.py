"""``tw_act``: play one command in the rollout's TextWorld game (``agentfly.envs.textgames``).

The game comes from the task sample's ``game`` field (``{"theme", "seed", "params"}``, as
``agentfly.tasks.textworld_games`` makes them). The first call of a rollout loads it and shows the game's
opening (with its objective) before the command's answer. Each point the game awards is a turn reward
(``context.reward_turn``: the score's change over the game's maximum), and the outcome is the win
(``context.info["env_score"]``: 1 for a won game, else 0), which the ``env_score`` reward reads. A won or
lost game (or one out of moves) ends the rollout after the command (``context.end_episode``).
"""

from __future__ import annotations

from typing import Any

from agentfly.tools.tool import tool

RESOURCE = "textworld"


@tool(resource=RESOURCE, timeout=120)
async def tw_act(command: str, context: Any) -> str:
    """Type one command into the text game and read what happens.

    Args:
        command: A game command, e.g. "look", "inventory", "go north", "open fridge", "take apple",
            "examine cookbook", "put key in box".
    """
    game = (getattr(context, "sample", {}) or {}).get("game")
    if not isinstance(game, dict):
        raise ValueError("this rollout's sample has no TextWorld 'game' field; use a textworld:<theme> task")
    env = await context.resource(RESOURCE)
    from agentfly.envs.textgames import observe

    state = await env.play(game, command)
    if state["gained"] and state["max_score"]:
        context.reward_turn(state["gained"] / state["max_score"],
                            f"score {state['score'] - state['gained']} -> {state['score']}")
    context.info["env_score"] = 1.0 if state["won"] else 0.0
    if state["done"]:
        context.end_episode("won" if state["won"] else ("lost" if state["lost"] else "out of moves"))
    return observe(state, state["answer"], state["intro"])
