"""The ScienceWorld task set and the env_score reward: shipped data and pure functions, no JVM."""

from __future__ import annotations

import pytest

from agentfly.context import RolloutContext
from agentfly.envs import scienceworld_tasks, task_names
from agentfly.rewards.builtin.env import env_score
from agentfly.tools.builtin.scienceworld import episode


def test_the_task_set_keeps_train_and_test_variations_apart() -> None:
    train, test = scienceworld_tasks("train"), scienceworld_tasks("test")
    assert len(task_names()) == 30
    assert {s["task"] for s in train} == set(task_names())
    train_keys = {(s["task"], s["variation"]) for s in scienceworld_tasks("train", described_only=False)}
    assert not train_keys & {(s["task"], s["variation"]) for s in scienceworld_tasks("test", described_only=False)}
    assert "Your task is to boil water" in next(s for s in train if s["id"] == "boil/0")["prompt"]
    assert len(scienceworld_tasks("train", tasks=["boil"], variations_per_task=2)) == 2
    assert all(s["split"] == "test" for s in test)


def test_bad_task_set_requests_name_the_problem() -> None:
    with pytest.raises(ValueError, match="unknown ScienceWorld task"):
        scienceworld_tasks("train", tasks=["bake-a-cake"])
    with pytest.raises(ValueError, match="split='validation'"):
        scienceworld_tasks("validation")


def test_injected_info_overrides_the_samples_task_and_variation() -> None:
    ctx = RolloutContext(sample={"task": "boil", "variation": 3}, rollout_id="r", group_id="g")
    assert episode(ctx) == ("boil", 3)
    ctx.info.update(task="melt", variation=7)
    assert episode(ctx) == ("melt", 7)
    with pytest.raises(ValueError, match="names no ScienceWorld task"):
        episode(RolloutContext(sample={}, rollout_id="r", group_id="g"))


async def test_env_score_reads_the_last_score_the_environment_reported() -> None:
    ctx = RolloutContext(sample={}, rollout_id="r", group_id="g")
    assert (await env_score.score(None, None, ctx, {})).reward == 0.0
    ctx.info["env_score"] = 0.25
    assert (await env_score.score(None, None, ctx, {})).reward == 0.25
