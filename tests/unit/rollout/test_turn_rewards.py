"""Turn rewards: a tool credits the turn whose call it runs (``context.reward_turn``), a reward may return
per-turn scores, and every turn records the state it acted from; all kept on the trajectory beside the outcome."""

from __future__ import annotations

import json
from typing import Any

import pytest

import agentfly as af
from agentfly.context import RolloutContext
from agentfly.rollout import TurnReward


def call(name: str, **arguments: Any) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


@af.tool
def hop(key: str, context: Any) -> str:
    """Follow a key; a right key earns its turn 0.25."""
    if key.startswith("k"):
        context.reward_turn(0.25, f"found {key}")
        return "next: " + key.upper()
    return "no such key"


def three_turns(prompt: str) -> str:
    seen = prompt.count("<tool_response>")
    return [call("hop", key="k1"), call("hop", key="x"), "done"][seen]


async def test_a_tool_credits_the_turn_whose_call_it_runs_and_the_trajectory_keeps_it(tiny_tokenizer: Any) -> None:
    agent = af.Agent(model=af.ReplayEngine(tiny_tokenizer, three_turns), tools=[hop], max_turns=4)
    [traj] = await agent.run([{"question": "go"}])
    assert traj.num_turns == 3
    assert traj.turn_rewards == [TurnReward(0, 0.25, "found k1")]
    assert traj.rewards_per_turn() == [0.25, 0.0, 0.0]
    assert af.Trajectory.from_dict(json.loads(json.dumps(traj.to_dict()))).turn_rewards == traj.turn_rewards


async def test_a_reward_may_return_per_turn_scores_beside_its_outcome(tiny_tokenizer: Any) -> None:
    @af.reward
    def graded(trajectory: Any) -> dict[str, Any]:
        return {"reward": 1.0, "turn_rewards": [0.1 * (k + 1) for k in range(trajectory.num_turns)]}

    agent = af.Agent(model=af.ReplayEngine(tiny_tokenizer, three_turns), tools=[hop], reward=graded, max_turns=4)
    [traj] = await agent.run([{"question": "go"}])
    assert traj.reward == 1.0 and traj.reward_error is None
    assert traj.rewards_per_turn() == pytest.approx([0.25 + 0.1, 0.2, 0.3])


async def test_a_reward_with_malformed_turn_scores_is_an_error_that_says_how_to_fix_it(tiny_tokenizer: Any) -> None:
    @af.reward
    def broken() -> dict[str, Any]:
        return {"reward": 1.0, "turn_rewards": "high"}

    agent = af.Agent(model=af.ReplayEngine(tiny_tokenizer, three_turns), tools=[hop], reward=broken, max_turns=4)
    [traj] = await agent.run([{"question": "go"}])
    assert traj.reward == 0.0 and "give a list of numbers, one per turn" in (traj.reward_error or "")


async def test_turns_after_the_same_observations_share_a_state_and_others_do_not(tiny_tokenizer: Any) -> None:
    def script(prompt: str) -> str:
        seen = prompt.count("<tool_response>")
        key = "k1" if "#same#" in prompt else "k2"
        return [call("hop", key=key), "done"][seen]

    agent = af.Agent(model=af.ReplayEngine(tiny_tokenizer, script), tools=[hop], max_turns=4)
    a, b, c = await agent.run([{"question": "#same# a"}, {"question": "#same# b"}, {"question": "other"}])
    assert a.turns[0].state == b.turns[0].state == c.turns[0].state == ""  # all start from their prompt
    assert a.turns[1].state == b.turns[1].state != c.turns[1].state


def test_reward_turn_refuses_what_is_not_a_number() -> None:
    ctx = RolloutContext(sample={}, rollout_id="r", group_id="g")
    with pytest.raises(TypeError, match="give a finite number"):
        ctx.reward_turn("1")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="give a finite number"):
        ctx.reward_turn(float("nan"))


@af.tool
def final_door(context: Any) -> str:
    """Open the last door: the episode is over."""
    context.end_episode("won")
    return "You escaped."


async def test_a_tool_that_ends_the_episode_stops_the_rollout_after_its_observation(tiny_tokenizer: Any) -> None:
    def script(prompt: str) -> str:
        return call("final_door")  # the model would go on calling it turn after turn

    agent = af.Agent(model=af.ReplayEngine(tiny_tokenizer, script), tools=[final_door], max_turns=4)
    [traj] = await agent.run([{"question": "go"}])
    assert traj.num_turns == 1 and traj.finish_reason == "answer" and traj.final_answer == "won"
    assert "You escaped." in tiny_tokenizer.decode(traj.token_ids)
    assert traj.loss_mask[-1] == 0  # it ends on the observation, which is not trained on
