"""``tw_act``: play one command in the rollout's TextWorld game (``agentfly.envs.textgames``).

The game comes from the task sample's ``game`` field (``{"theme", "seed", "params"}``, as
``agentfly.tasks.textworld_games`` makes them). The first call of a rollout loads it and shows the game's
opening (with its objective) before the command's answer. Each point the game awards is a turn reward
(``context.reward_turn``: the score's change over the game's maximum), and the outcome is the win
(``context.info["env_score"]``: 1 for a won game, else 0), which the ``env_score`` reward reads.
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
    from agentfly.envs.textgames import game_key

    intro = await env.load(game) if env.loaded != game_key(game) else ""
    before = env.score
    answer = await env.act(command)
    if env.score != before and env.max_score:
        context.reward_turn((env.score - before) / env.max_score, f"score {before} -> {env.score}")
    context.info["env_score"] = 1.0 if env.won else 0.0
    return str(env.observe(answer, intro))
