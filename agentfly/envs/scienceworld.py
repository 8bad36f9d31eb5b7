"""ScienceWorld (Wang et al., 2022) as a pooled environment resource, and its task set.

Each instance is a JVM running the simulator from the ``scienceworld`` PyPI package (it ships its jar; it
needs a Java runtime). Starting a JVM takes seconds, loading a task a fraction of one, so instances are
pooled per job and a rollout only calls ``load(task, variation)`` on its first action.

    SCIENCEWORLD = ResourceSpec(name="scienceworld", factory=ScienceWorld, kind="environment", ...)
    tasks = scienceworld_tasks("train")          # [{"id", "task", "variation", "prompt", "split"}, ...]
    agent = af.Agent(model, tools=[sciworld_act, sciworld_look], reward=env_score,
                     resources=af.ResourceEngine([SCIENCEWORLD]))

The reward is the environment's own score, 0-100, scaled to 0-1 (a failed task scores 0).

    python -m agentfly.envs.scienceworld --build-index      # regenerate data/scienceworld_tasks.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
from functools import cache
from pathlib import Path
from typing import Any

from agentfly.envs.worker_env import WorkerEnvironment
from agentfly.resources.builtin import register_builtin
from agentfly.resources.spec import Pool, ResourceSpec

INDEX_PATH = Path(__file__).with_name("data") / "scienceworld_tasks.json"
SPLITS = ("train", "dev", "test")
PROMPT = (
    "You are an agent in ScienceWorld, a text-based science simulator. {description}\n"
    "Act with the sciworld_act tool (for example 'look around', 'open door to kitchen', 'go to kitchen', "
    "'pick up thermometer', 'focus on substance'); sciworld_look shows where you are. Stop when the task "
    "is complete."
)


def java_available() -> str | None:
    """None when ScienceWorld can start here, else the reason (for skips and errors)."""
    import shutil

    try:
        import scienceworld  # noqa: F401
    except ImportError:
        return "the scienceworld package is not installed (pip install scienceworld)"
    if shutil.which("java") is None:
        return "no Java runtime on PATH (apt-get install default-jre-headless)"
    return None


class ScienceWorld(WorkerEnvironment):
    """One ScienceWorld simulator (a JVM in a child process).

    Args:
        spec: the ResourceSpec when built by a pool; ``spec.options`` may set ``simplification`` (default
            "easy": doors open, teleporting allowed, which small models need), ``step_limit`` (100) and
            ``java_options`` (default: a 1 GiB heap, serial GC and quick JIT, for many small JVMs).
    """

    title = "ScienceWorld"

    def __init__(self, spec: Any = None, *, simplification: str | None = None, step_limit: int | None = None) -> None:
        super().__init__()
        options = dict(getattr(spec, "options", None) or {})
        self.simplification = simplification if simplification is not None else options.get("simplification", "easy")
        self.step_limit = int(step_limit or options.get("step_limit", 100))
        # The JVM's default heap is a quarter of the machine's memory; pooled JVMs must not each claim that.
        self.java_options = str(options.get("java_options", "-Xmx1g -XX:+UseSerialGC -XX:TieredStopAtLevel=1"))
        self.loaded: tuple[str, int] | None = None
        self.task_description = ""
        self.score = 0.0  # 0..100 as ScienceWorld reports it
        self.done = False
        self.moves = 0

    async def start(self) -> None:
        # The JVM needs memory and localhost: it runs unhardened, as the trusted simulator it is.
        await self.start_worker("agentfly.envs._sciworld_worker",
                                {"AGENTFLY_SCIWORLD_STEP_LIMIT": str(self.step_limit),
                                 "JAVA_TOOL_OPTIONS": self.java_options}, java_available())

    async def load(self, task: str, variation: int = 0) -> str:
        """Start an episode of ``task`` (a name from ``task_names()``) in ``variation``; returns the first view."""
        reply = await self._ask({"op": "load", "task": task, "variation": int(variation),
                                 "simplification": self.simplification})
        self.loaded = (task, int(variation))
        self.task_description = reply["task_description"]
        self.score, self.done, self.moves = float(reply.get("score", 0)), False, 0
        return str(reply["observation"])

    async def gold_actions(self, task: str, variation: int = 0) -> tuple[list[str], str]:
        """The simulator's gold action sequence for ``task``/``variation`` (under this instance's
        simplification) and the task description; it unloads any episode, so ``load`` before acting."""
        reply = await self._ask({"op": "gold", "task": task, "variation": int(variation),
                                 "simplification": self.simplification})
        self.loaded = None
        return [str(a) for a in reply["actions"]], str(reply["task_description"])

    async def act(self, action: str) -> str:
        """Take one action; returns the observation and updates ``score``, ``done`` and ``moves``."""
        reply = await self._ask({"op": "step", "action": action})
        self.score, self.done, self.moves = float(reply["score"]), bool(reply["done"]), int(reply["moves"])
        return str(reply["observation"])

    async def look(self) -> str:
        return str((await self._ask({"op": "look"}))["observation"])

    @property
    def reward(self) -> float:
        """The score as a reward in [0, 1]; ScienceWorld's -100 for a failed task becomes 0."""
        return max(0.0, min(100.0, self.score)) / 100.0

    async def reset(self) -> None:
        """Forget the episode; the next rollout loads its own task. Fails if the JVM stopped answering."""
        await self._ask({"op": "unload"}, timeout=10)
        self.loaded, self.task_description, self.score, self.done, self.moves = None, "", 0.0, False, 0


SCIENCEWORLD = register_builtin(ResourceSpec(
    name="scienceworld",
    factory=ScienceWorld,
    kind="environment",
    backend="local",
    pool=Pool(min=0, max=4),
    scope="rollout",
    acquire_timeout=180,
    health_interval=60,
))


# ---------------------------------------------------------------------------------------------- task set
@cache
def task_index() -> dict[str, Any]:
    """Task names with their train/dev/test variations and some task descriptions (shipped JSON)."""
    index: dict[str, Any] = json.loads(INDEX_PATH.read_text())
    return index


def task_names() -> list[str]:
    return sorted(task_index()["tasks"])


def scienceworld_tasks(
    split: str = "train",
    tasks: list[str] | None = None,
    variations_per_task: int | None = None,
    described_only: bool = True,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Samples ``{"id", "task", "variation", "prompt", "split"}`` for the rollout loop.

    Args:
        split: "train", "dev" or "test": ScienceWorld's own variation splits, so test variations never
            appear in training.
        tasks: task names to include (default: all 30).
        variations_per_task: keep at most this many variations per task (a seeded random choice).
        described_only: only variations whose task description ships in the index, so the prompt states
            the exact goal; False includes every variation with a generic prompt.
        seed: for the choice of variations.
    """
    if split not in SPLITS:
        raise ValueError(f"split={split!r}; use one of {SPLITS}")
    index = task_index()["tasks"]
    chosen = tasks or sorted(index)
    unknown = [t for t in chosen if t not in index]
    if unknown:
        raise ValueError(f"unknown ScienceWorld task(s) {unknown}; known: {sorted(index)}")
    rng = random.Random(f"scienceworld:{split}:{seed}")
    samples = []
    for task in chosen:
        entry = index[task]
        descriptions: dict[str, str] = entry.get("descriptions", {})
        variations = list(entry[split])
        if described_only:
            variations = [v for v in variations if str(v) in descriptions]
        if variations_per_task is not None and len(variations) > variations_per_task:
            variations = sorted(rng.sample(variations, variations_per_task))
        for v in variations:
            description = descriptions.get(str(v)) or (
                f"Your task is '{task.replace('-', ' ')}' (variation {v}); use sciworld_look to read it in full."
            )
            samples.append({"id": f"{task}/{v}", "task": task, "variation": v, "split": split,
                            "prompt": PROMPT.format(description=description)})
    return samples


async def build_index(described: dict[str, int]) -> dict[str, Any]:
    """Ask a live simulator for every task's variation splits and a few task descriptions per split."""
    env = ScienceWorld()
    await env.start()
    try:
        names = (await env._ask({"op": "tasks"}))["tasks"]
        result: dict[str, Any] = {}
        for task in names:
            splits = await env._ask({"op": "variations", "task": task})
            entry: dict[str, Any] = {s: splits[s] for s in SPLITS}
            entry["descriptions"] = {}
            for split, n in described.items():
                for v in splits[split][:n]:
                    reply = await env._ask({"op": "describe", "task": task, "variation": v})
                    entry["descriptions"][str(v)] = reply["task_description"]
            result[task] = entry
            print(f"{task}: {len(entry['train'])}/{len(entry['dev'])}/{len(entry['test'])}", file=sys.stderr)
        return {"source": "scienceworld " + _package_version(), "tasks": result}
    finally:
        await env.close()


def _package_version() -> str:
    from importlib.metadata import version

    return version("scienceworld")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build-index", action="store_true", help="regenerate the shipped task index")
    parser.add_argument("--described", type=int, default=8, help="descriptions per task and split")
    args = parser.parse_args(argv)
    if args.build_index:
        index = asyncio.run(build_index({"train": args.described, "dev": args.described // 2,
                                         "test": args.described // 2}))
        INDEX_PATH.write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")
        print(f"wrote {INDEX_PATH}")
    else:
        parser.print_help()


if __name__ == "__main__":
    main()
