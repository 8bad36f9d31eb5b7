"""TextWorld games through the resource engine: generated and compiled on first use (cached), played and scored
inside a pooled player that rollouts share, reset between them, and replaced when it dies."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentfly.context import RolloutContext
from agentfly.envs import TEXTWORLD
from agentfly.envs.textgames import compile_game, game_key, textworld_available
from agentfly.resources import Pool, ResourceEngine
from agentfly.rewards.builtin.env import env_score
from agentfly.tasks import get_task
from agentfly.tools.builtin.textworld import tw_act

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(textworld_available() is not None, reason=str(textworld_available()))]


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One game cache for the module's tests (a game takes seconds to compile), in a folder of its own."""
    folder = tmp_path_factory.mktemp("textworld-cache")
    before = os.environ.get("AGENTFLY_TEXTWORLD_CACHE")
    os.environ["AGENTFLY_TEXTWORLD_CACHE"] = str(folder)
    yield folder
    if before is None:
        os.environ.pop("AGENTFLY_TEXTWORLD_CACHE")
    else:
        os.environ["AGENTFLY_TEXTWORLD_CACHE"] = before


@pytest.fixture(scope="module")
def games(cache: Path) -> list[dict]:
    task = get_task("textworld:custom", {"rooms": 2, "objects": 3, "quest_length": 2})
    return [s["game"] for s in task.samples("test", 2, 0)]


async def test_a_pooled_player_plays_each_rollout_s_own_game_to_a_win_with_a_turn_reward_per_point(games, cache) -> None:
    spec = TEXTWORLD.replace(pool=Pool(min=1, max=1), acquire_timeout=120)
    async with ResourceEngine([spec]) as engine:
        pid = next(iter(engine.pools["textworld"].instances)).resource.pid
        for i, game in enumerate(games):
            context = RolloutContext(sample={"game": game}, rollout_id=f"r{i}", group_id="g", resources=engine)
            first = await tw_act.invoke({"command": "look"}, context=context)
            assert first.ok and "TextWorld" in first.observation and "(score 0/" in first.observation
            env = await context.resource("textworld")
            assert env.pid == pid and env.loaded == game_key(game) and (await env.state())["walkthrough"]
            for command in (await env.state())["walkthrough"]:
                result = await tw_act.invoke({"command": command}, context=context)
            assert "You won." in result.observation and context.ended == "won"  # the rollout stops here
            assert (await env_score.score(None, None, context, context.sample)).reward == 1.0
            assert sum(value for _, value, _ in context.turn_rewards) == pytest.approx(1.0)
            await context.aclose()
            await engine.settle()
        assert engine.stats()["textworld"]["created"] == 1  # one player, reset between the rollouts
    assert sorted(p.name for p in cache.glob("*.z8")) == sorted(f"{game_key(g)}.z8" for g in games)


async def test_a_lost_command_scores_nothing_and_a_dead_player_is_replaced(games) -> None:
    spec = TEXTWORLD.replace(pool=Pool(min=1, max=1), acquire_timeout=120)
    async with ResourceEngine([spec]) as engine:
        context = RolloutContext(sample={"game": games[0]}, rollout_id="a", group_id="g", resources=engine)
        result = await tw_act.invoke({"command": "dance wildly"}, context=context)
        assert result.ok and "(score 0/" in result.observation
        assert (await env_score.score(None, None, context, context.sample)).reward == 0.0
        env = await context.resource("textworld")
        os.kill(env.pid, signal.SIGKILL)
        await context.aclose()
        await engine.settle()
        again = RolloutContext(sample={"game": games[0]}, rollout_id="b", group_id="g", resources=engine)
        assert (await tw_act.invoke({"command": "look"}, context=again)).ok
        assert (await again.resource("textworld")).pid != env.pid
        await again.aclose()
        stats = engine.stats()["textworld"]
        assert stats["created"] == 2 and stats["kind"] == "environment"
        no_game = RolloutContext(sample={}, rollout_id="c", group_id="g", resources=engine)
        refused = await tw_act.invoke({"command": "look"}, context=no_game)
        assert "no TextWorld 'game' field" in refused.observation
        await no_game.aclose()


def test_a_game_compiles_once_and_a_second_ask_finds_it_in_the_cache(games, cache) -> None:
    first = compile_game(games[0])
    stamp = first.stat().st_mtime_ns
    assert compile_game(games[0]) == first and first.stat().st_mtime_ns == stamp
    assert first.with_suffix(".json").is_file() and not list(cache.glob(".make-*"))


def test_in_the_command_format_a_replayed_walkthrough_samples_bare_commands_and_wins(tiny_model_dir: Path,
                                                                                     cache: Path) -> None:
    """The game's own action format: each assistant turn is the command itself ("go north"), the tool schema is
    not in the prompt, and the SFT replay writes the task's Hermes demonstrations in that format."""
    from transformers import AutoTokenizer

    from trainer.config import load_config
    from trainer.sft import demonstration_conversations, demonstration_trajectories

    config = load_config(None, [
        f"model.path={tiny_model_dir}", "data.task=textworld:custom",
        "data.options={rooms: 1, objects: 2, quest_length: 1}", "rollout.tools=[agentfly.tools.builtin.textworld:tw_act]",
        "rollout.reward=agentfly.rewards.builtin.env:env_score", "rollout.parser=command", "rollout.max_turns=12",
        "sft.num_demos=2", "sft.wrong_fraction=0", "sft.habit=detour", "sft.habit_fraction=0", "resources={textworld: {max: 1}}"])
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    pairs = demonstration_conversations(config)
    for (_, messages), t in zip(pairs, demonstration_trajectories(config, tokenizer), strict=True):
        commands = [json.loads(m["content"].split("\n")[1])["arguments"]["command"]
                    for m in messages if m["role"] == "assistant" and "<tool_call>" in m["content"]]
        assert [turn.text for turn in t.turns] == commands  # the won game ends the rollout after the last one
        assert [c.arguments for c in t.tool_calls] == [{"command": c} for c in commands]
        assert t.reward == 1.0 and t.final_answer == "won"
        trained = tokenizer.decode([i for i, m in zip(t.token_ids, t.loss_mask, strict=True) if m])
        assert trained == "".join(c + "<|im_end|>" for c in commands)
        assert "tw_act" not in tokenizer.decode(t.token_ids[:t.turns[0].start])  # no tool schema shown

