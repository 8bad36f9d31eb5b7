"""TextWorld (Côté et al., 2018) games as a pooled environment resource.

A game is generated and compiled from ``(theme, params, seed)`` the first time any instance needs it, into a
cache shared by every instance and job on the host (``AGENTFLY_TEXTWORLD_CACHE``, default
``~/.cache/agentfly/textworld``): one writer per game file (a lock), written beside and renamed into place,
so a half-written game is never played. Each instance is a child process that plays one game at a time; a
rollout loads its game on its first action, and ``reset`` unloads it for the next rollout.

    TEXTWORLD = ResourceSpec(name="textworld", factory=TextGame, kind="environment", ...)
    game = {"theme": "cooking", "seed": 7, "params": {"recipe": 1, "take": 1, "go": 1}}
    env = await engine.acquire("textworld"); intro = await env.load(game); text = await env.act("open fridge")

Themes: ``cooking`` (tw-cooking: recipe, take, go, open, cook, cut), ``coin`` (tw-coin_collector: level),
``treasure`` (tw-treasure_hunter: level), ``simple`` (tw-simple: rewards, goal) and ``custom``
(``textworld.make``: rooms, objects, quest_length). TextWorld is an optional extra:
``pip install 'agentfly[envs]'``.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from agentfly.envs.worker_env import WorkerEnvironment
from agentfly.resources.builtin import register_builtin
from agentfly.resources.spec import Pool, ResourceSpec

CHALLENGES = {"cooking": "tw-cooking", "coin": "tw-coin_collector", "treasure": "tw-treasure_hunter",
              "simple": "tw-simple"}
THEMES = (*CHALLENGES, "custom")


def cache_dir() -> Path:
    return Path(os.environ.get("AGENTFLY_TEXTWORLD_CACHE") or Path.home() / ".cache" / "agentfly" / "textworld")


def textworld_available() -> str | None:
    """None when TextWorld can make and play games here, else the reason (for skips and errors)."""
    try:
        import textworld  # noqa: F401
    except ImportError:
        return "the textworld package is not installed (pip install 'agentfly[envs]')"
    return None


def game_key(game: dict[str, Any]) -> str:
    """The cache name of a game: its theme and a digest of its params and seed."""
    digest = hashlib.sha256(json.dumps([game["theme"], game.get("params", {}), int(game["seed"])],
                                       sort_keys=True).encode()).hexdigest()[:20]
    return f"{game['theme']}-{digest}"


def _make(theme: str, params: dict[str, Any], seed: int, path: Path) -> None:
    import argparse

    import textworld
    import textworld.challenges

    options = textworld.GameOptions()
    options.seeds = seed
    options.path = str(path)
    options.file_ext = ".z8"
    options.force_recompile = True
    if theme == "custom":
        options.nb_rooms = int(params.get("rooms", 2))
        options.nb_objects = int(params.get("objects", 4))
        length = int(params.get("quest_length", 2))
        options.chaining.min_length = options.chaining.max_length = options.chaining.max_depth = length
        textworld.make(options)
        return
    _, make, add_arguments = textworld.challenges.CHALLENGES[CHALLENGES[theme]]
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    argv = []
    for name, value in params.items():
        if isinstance(value, bool):
            argv += [f"--{name}"] if value else []
        else:
            argv += [f"--{name}", str(value)]
    game = make(vars(parser.parse_args(argv)), options)
    textworld.generator.compile_game(game, options)


def compile_game(game: dict[str, Any], root: str | Path | None = None) -> Path:
    """The compiled game file for ``game`` (``{"theme", "seed", "params"}``), made now if the cache lacks it."""
    if game.get("theme") not in THEMES:
        raise ValueError(f"unknown TextWorld theme {game.get('theme')!r}; themes: {', '.join(THEMES)}")
    folder = Path(root) if root else cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{game_key(game)}.z8"
    if target.is_file() and target.with_suffix(".json").is_file():
        return target
    with open(folder / f".{target.stem}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one writer; the others wait, then find it made
        if target.is_file() and target.with_suffix(".json").is_file():
            return target
        scratch = Path(tempfile.mkdtemp(dir=folder, prefix=".make-"))
        try:
            _make(str(game["theme"]), dict(game.get("params", {})), int(game["seed"]), scratch / target.name)
            os.replace(scratch / target.with_suffix(".json").name, target.with_suffix(".json"))
            os.replace(scratch / target.name, target)  # the .z8 last: its presence means the pair is whole
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return target


def observe(state: dict[str, Any], answer: str, intro: str = "") -> str:
    """What the agent reads after a command: the opening on a rollout's first command, the game's answer, and
    the score line (the one format ``tw_act`` and the demonstrations share)."""
    end = " You won." if state["won"] else (" You lost." if state["lost"] else (" The episode is over." if state["done"] else ""))
    opening = f"{intro.strip()}\n\n" if intro.strip() else ""
    return f"{opening}{answer.strip()}\n(score {state['score']}/{state['max_score']}, moves {state['moves']}.{end})"


class TextGame(WorkerEnvironment):
    """One TextWorld player (a child process) that compiles and plays the games rollouts load.

    Args:
        spec: the ResourceSpec when built by a pool; ``spec.options`` may set ``cache_dir`` and ``step_limit``
            (moves before an episode counts as over; default 50).
    """

    title = "TextWorld"

    def __init__(self, spec: Any = None) -> None:
        super().__init__()
        options = dict(getattr(spec, "options", None) or {})
        self.cache = str(options.get("cache_dir") or cache_dir())
        self.step_limit = int(options.get("step_limit", 50))
        self.loaded: str | None = None
        self.objective = ""
        self.walkthrough: list[str] = []
        self.score = self.max_score = self.moves = 0
        self.won = self.lost = self.done = False

    async def start(self) -> None:
        await self.start_worker("agentfly.envs._textworld_worker", {}, textworld_available())

    async def _ask(self, message: dict[str, Any], timeout: float = 120) -> dict[str, Any]:
        return await super()._ask(message, timeout)  # a first load compiles its game: seconds

    def _update(self, reply: dict[str, Any]) -> None:
        self.score, self.max_score, self.moves = int(reply["score"]), int(reply["max_score"]), int(reply["moves"])
        self.won, self.lost = bool(reply["won"]), bool(reply["lost"])
        self.done = self.won or self.lost or bool(reply.get("done")) or self.moves >= self.step_limit

    async def load(self, game: dict[str, Any]) -> str:
        """Start an episode of ``game`` (compiled first if the cache lacks it); returns the opening text. The
        game's own winning commands from here are ``walkthrough`` (for demonstrations)."""
        reply = await self._ask({"op": "load", "game": game, "cache_dir": self.cache})
        self.loaded, self.objective = game_key(game), str(reply.get("objective") or "")
        self.walkthrough = [str(c) for c in reply.get("commands", [])]
        self._update(reply)
        return str(reply["observation"])

    async def act(self, command: str) -> str:
        """Play one command; returns the game's answer and updates score, moves, won, lost and done."""
        reply = await self._ask({"op": "step", "command": command}, timeout=60)
        self._update(reply)
        return str(reply["observation"])

    async def play(self, game: dict[str, Any], command: str) -> dict[str, Any]:
        """One command of ``game`` in one call: the game is loaded first if this player holds another (or none),
        so a remote player (a Ray actor) needs one round trip a turn and no attribute reads. Returns the
        ``state()`` after the command, with ``answer`` (the game's) and ``intro`` (its opening, on a load)."""
        intro = await self.load(game) if self.loaded != game_key(game) else ""
        before = self.score
        answer = await self.act(command)
        return {**self._state(), "answer": answer, "intro": intro, "gained": self.score - before}

    async def state(self) -> dict[str, Any]:
        """Score, moves, won/lost/done and the game's winning commands from the start (async, as every call a
        remote player answers)."""
        return self._state()

    def _state(self) -> dict[str, Any]:
        return {"score": self.score, "max_score": self.max_score, "moves": self.moves, "won": self.won,
                "lost": self.lost, "done": self.done, "walkthrough": list(self.walkthrough)}

    async def reset(self) -> None:
        """Forget the episode; fails if the player stopped answering (the pool then replaces it)."""
        await self._ask({"op": "unload"}, timeout=10)
        self.loaded, self.objective = None, ""
        self.score = self.max_score = self.moves = 0
        self.won = self.lost = self.done = False


TEXTWORLD = register_builtin(ResourceSpec(
    name="textworld",
    factory=TextGame,
    kind="environment",
    backend="local",
    pool=Pool(min=0, max=4),
    scope="rollout",
    acquire_timeout=180,
    health_interval=60,
))
