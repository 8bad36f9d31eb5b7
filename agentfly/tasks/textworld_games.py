"""``textworld:<theme>``: text games generated per seed (``agentfly.envs.textgames``), played with ``tw_act``.

    data: {task: "textworld:custom", options: {rooms: [2, 4], quest_length: [2, 5]}}
    data: {task: "textworld:cooking", options: {recipe: [1, 2], take: [0, 2], go: 1}}
    rollout: {tools: [agentfly.tools.builtin.textworld:tw_act], reward: agentfly.rewards.builtin.env:env_score,
              max_turns: 12}

An option is one value or an inclusive range ``[low, high]`` that each game draws from (seeded by the game's
seed). Each sample is one game, ``{"id", "question", "game": {"theme", "seed", "params"}}``; the train and test
splits draw their games' seeds from disjoint streams, so held-out games are unseen. Games compile on first use
and are cached. The game's score changes are per-turn rewards and the win is the outcome.

The SFT warm start plays the games' own walkthroughs (``look`` first, then the winning commands); its flaws:
a share ``sft.wrong_fraction`` stop one command short of winning, and the ``detour`` habit wanders (two
commands that lead nowhere) on a share ``sft.habit_fraction`` of the games.
"""

from __future__ import annotations

import asyncio
import random
import zlib
from typing import Any

from agentfly.tasks.base import (
    FlawError,
    Flaws,
    Messages,
    Sample,
    Task,
    TaskOptionError,
    UnknownTask,
    check_options,
)

PROMPT = ("You are playing a text adventure game. Play one command at a time (for example 'look', 'inventory', "
          "'go north', 'open fridge', 'take apple'). Start with 'look' to read your goal, then play until you win.")
# Each theme's options with their defaults (a value, or an inclusive [low, high] range drawn per game).
OPTIONS: dict[str, dict[str, Any]] = {
    "custom": {"rooms": [2, 3], "objects": [3, 5], "quest_length": [1, 3]},
    "cooking": {"recipe": 1, "take": [0, 1], "go": 1, "open": False, "cook": False, "cut": False},
    "coin": {"level": [1, 10]},
    "treasure": {"level": [1, 5]},
    "simple": {"rewards": "dense", "goal": "detailed"},
}
CHOICES = {"go": (1, 6, 9, 12), "rewards": ("dense", "balanced", "sparse"), "goal": ("detailed", "brief", "none")}
HABITS = ("detour",)
DETOUR = ("inventory", "look")


def _check(theme: str, options: dict[str, Any]) -> dict[str, Any]:
    """The theme's options with ``options`` over its defaults, each value checked."""
    if theme not in OPTIONS:
        raise UnknownTask(f"TextWorld has no theme {theme!r}; its themes are {', '.join(OPTIONS)}")
    check_options(options, OPTIONS[theme], f"textworld:{theme}")
    merged = {**OPTIONS[theme], **options}
    for name, value in merged.items():
        default = OPTIONS[theme][name]
        values = value if isinstance(value, list) else [value]
        if isinstance(value, list) and (len(value) != 2 or not all(isinstance(v, int) for v in value) or value[0] > value[1]):
            raise TaskOptionError(name, f"data.options.{name}={value!r}: give one value or a range [low, high] of "
                                  "two integers with low <= high")
        for v in values:
            if isinstance(default, bool) and not isinstance(v, bool):
                raise TaskOptionError(name, f"data.options.{name}={v!r}: give true or false")
            if not isinstance(default, bool) and isinstance(default, (int, list)) and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                raise TaskOptionError(name, f"data.options.{name}={v!r}: give a whole number >= 0 (or a range)")
            if name in CHOICES and not isinstance(value, list) and v not in CHOICES[name]:
                raise TaskOptionError(name, f"data.options.{name}={v!r}: choose one of {', '.join(map(str, CHOICES[name]))}")
    return merged


def _draw(options: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    params = {}
    for name, value in options.items():
        if isinstance(value, list):
            params[name] = rng.choice([c for c in CHOICES.get(name, ()) if value[0] <= c <= value[1]]
                                      or [value[0]]) if name in CHOICES else rng.randint(value[0], value[1])
        else:
            params[name] = value
    return params


def samples(theme: str, options: dict[str, Any], split: str, n: int, seed: int) -> list[Sample]:
    """``n`` games of ``split``; each split's game seeds come from its own stream."""
    out = []
    for i in range(n):
        game_seed = zlib.crc32(f"textworld:{theme}:{split}:{seed}:{i}".encode()) % 65_536
        params = _draw(options, random.Random(f"textworld-params:{game_seed}"))
        out.append({"id": f"{theme}/{split}-{seed}-{i}", "question": PROMPT,
                    "game": {"theme": theme, "seed": game_seed, "params": params}})
    return out


async def _play(games: list[dict[str, Any]], detours: set[int]) -> list[list[tuple[str, str]]]:
    """Each game played on one TextWorld instance: ``look``, the detour's commands for the games in
    ``detours``, then the game's winning commands; each command with the game's real answer."""
    from agentfly.envs.textgames import TextGame, observe

    env = TextGame()
    await env.start()
    try:
        played = []
        for i, game in enumerate(games):
            intro = await env.load(game)
            commands = ["look", *(DETOUR if i in detours else ()), *(await env.state())["walkthrough"]]
            steps: list[tuple[str, str]] = []
            for command in commands:
                answer = await env.act(command)
                steps.append((command, observe(await env.state(), answer, "" if steps else intro)))
            played.append(steps)
            await env.reset()
        return played
    finally:
        await env.close()


def demonstrations(theme: str, options: dict[str, Any], n: int, seed: int, flaws: Flaws) -> list[tuple[Sample, Messages]]:
    """``n`` played walkthroughs in the Hermes format (tool observations are the game's real answers, the
    first with the game's opening, as ``tw_act`` shows it)."""
    if (flaws.habit or flaws.habit_phrasings) and flaws.habit not in HABITS:
        raise FlawError("habit", f"habit={flaws.habit} is not a TextWorld habit; it has {' and '.join(HABITS)}")
    chosen = samples(theme, options, "sft", n, seed)
    rng = flaws.rng()
    detour = set(rng.sample(range(n), round(flaws.habit_fraction * n))) if flaws.habit else set()
    short = set(rng.sample([i for i in range(n) if i not in detour], round(flaws.wrong_fraction * (n - len(detour)))))
    played = asyncio.run(_play([s["game"] for s in chosen], detour))
    pairs = []
    for i, (sample, steps) in enumerate(zip(chosen, played, strict=True)):
        if i in short and len(steps) > 1:
            steps = steps[:-1]  # stops one command short of winning
        messages: Messages = [{"role": "user", "content": sample["question"]}]
        for command, answer in steps:
            messages.append({"role": "assistant", "content": '<tool_call>\n{"name": "tw_act", "arguments": '
                             f'{{"command": "{command}"}}}}\n</tool_call>'})
            messages.append({"role": "tool", "content": answer, "name": "tw_act"})
        messages.append({"role": "assistant", "content": "I won the game." if i not in short else "I am done."})
        pairs.append((sample, messages))
    return pairs


def make_task(theme: str, options: dict[str, Any]) -> Task:
    """The TextWorld task of ``theme`` with ``options`` (checked now)."""
    from agentfly.envs.textgames import textworld_available

    reason = textworld_available()
    if reason:
        raise ImportError(f"textworld:{theme}: {reason}")
    merged = _check(theme, options)
    return Task(
        name=f"textworld:{theme}", title=f"TextWorld: {theme} games",
        samples=lambda split, n, seed: samples(theme, merged, split, n, seed),
        tools=("agentfly.tools.builtin.textworld:tw_act",), reward="agentfly.rewards.builtin.env:env_score",
        demonstrations=lambda n, seed, flaws: demonstrations(theme, merged, n, seed, flaws), habits=HABITS)
