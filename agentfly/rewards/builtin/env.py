"""``env_score``: the reward an environment itself gives (e.g. ScienceWorld's task score), in [0, 1].

Environment tools write the latest score to ``context.info["env_score"]`` after every action, so the
reward needs no access to the environment (which is released when the rollout ends).
"""

from __future__ import annotations

from typing import Any

from agentfly.rewards.reward import reward


@reward
def env_score(context: Any) -> float:
    """The environment's last reported score in [0, 1]; 0 when the agent never acted."""
    info = getattr(context, "info", None) or {}
    return float(max(0.0, min(1.0, info.get("env_score", 0.0))))
