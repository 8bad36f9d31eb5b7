"""The code-repair task: generated projects whose mutated line fails their tests, splits that share no code,
demonstrations with their deliberate flaws, and a reward that is the tests' pass share in the workspace."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from agentfly.context import RolloutContext
from agentfly.resources import ResourceEngine
from agentfly.rewards.builtin.repair import repair_tests
from agentfly.rollout.trajectory import Trajectory
from agentfly.tasks import Flaws, get_task
from agentfly.tasks.base import FlawError
from agentfly.tasks.code_repair import generate
from agentfly.tools.builtin.workspace import WORKSPACE, workspace_of

DEF = re.compile(r"^def \w+\(.*?(?=^def |\Z)", re.S | re.M)


def _bodies(samples: list[dict[str, Any]]) -> set[str]:
    """Every function of the projects, correct (names stripped: a split owns code, not names; a mutant may
    look like another split's function, whose constant it moved)."""
    found = set()
    for s in samples:
        for path, text in {**s["files"], **s["fixed"]}.items():
            if not path.startswith("tests/"):
                found.update(re.sub(r"^def \w+", "def f", body).strip() for body in DEF.findall(text))
    return found


def test_held_out_projects_share_no_function_and_no_name_with_training_ones() -> None:
    train, test = generate(150, 0, "train"), generate(60, 0, "test")
    assert not _bodies(train) & _bodies(test)
    assert not {s["project"] for s in train} & {s["project"] for s in test}
    assert generate(5, 0, "test") == test[:5]  # reproducible by seed


def test_every_project_has_one_mutated_file_that_fails_some_but_not_all_of_its_tests() -> None:
    for s in generate(40, 1, "train"):
        (path, fixed), = s["fixed"].items()
        assert s["files"][path] != fixed and path in s["files"] and not path.startswith("tests/")
        assert 0 < s["baseline"] < 1 and s["n_tests"] == sum(t.count("def test_") for t in s["test_files"].values())
        assert s["bug"]["kind"] in {"operator", "comparison", "bound", "condition"}


def test_demonstrations_fix_the_bug_except_the_deliberately_wrong_and_hasty_ones() -> None:
    task = get_task("code_repair")
    assert task.demonstrations is not None
    flaws = Flaws(wrong_fraction=0.25, habit="skip_check", habit_phrasings=("The unit tests",), habit_fraction=0.5)
    pairs = task.demonstrations(40, 0, flaws)
    written = [json.loads(m[5]["content"].split("\n")[1])["arguments"] for _, m in pairs]  # the write_file call
    fixed = [w["content"] == s["fixed"][w["path"]] for w, (s, _) in zip(written, pairs, strict=True)]
    rechecked = [sum("run_tests" in x["content"] for x in m if x["role"] == "assistant") == 2 for _, m in pairs]
    assert rechecked.count(False) == 20  # half of them skip the second test run
    assert fixed.count(False) == 5  # a quarter of the other 20 leave the bug in place
    with pytest.raises(FlawError, match="skip_check"):
        task.demonstrations(4, 0, Flaws(habit="early_answer", habit_phrasings=("The",)))


async def test_the_reward_is_the_pass_share_after_the_fix_and_nothing_for_edited_tests() -> None:
    sample = generate(1, 3, "test")[0]
    (path, fixed), = sample["fixed"].items()
    test_path = next(iter(sample["test_files"]))
    async with ResourceEngine([WORKSPACE]) as resources:
        async def score(edit: dict[str, str]) -> tuple[dict[str, float], Trajectory]:
            ctx = RolloutContext(sample=sample, rollout_id="r", group_id="g", resources=resources)
            traj = Trajectory(sample=sample, rollout_id="r", group_id="g")
            try:
                ws = await workspace_of(ctx)
                for p, text in edit.items():
                    await ws.write_file(p, text)
                result = await repair_tests.score("done", traj, ctx, sample)
            finally:
                await ctx.aclose()
            assert result.error is None, result.error
            return {"reward": result.reward, **result.metrics}, traj

        untouched, _ = await score({})
        assert untouched["reward"] == pytest.approx(sample["baseline"])
        repaired, traj = await score({path: fixed})
        assert repaired["reward"] == 1.0 and repaired["passed"] == sample["n_tests"]
        assert f"+++ b/{path}" in traj.artifacts["diff"] and "passed" in traj.artifacts["tests"]
        cheated, traj = await score({path: fixed, test_path: "def test_nothing():\n    pass\n"})
        assert (cheated["reward"], cheated["edited_tests"]) == (0.0, 1.0) and test_path in traj.artifacts["tests"]
        skipped, _ = await score({"conftest.py": "collect_ignore = ['tests']\n"})
        assert skipped["reward"] == 0.0
        # Never touched: the baseline, without running anything.
        ctx = RolloutContext(sample=sample, rollout_id="r", group_id="g", resources=resources)
        assert (await repair_tests.score("done", None, ctx, sample)).reward == pytest.approx(sample["baseline"])


def test_every_function_family_draws_its_test_cases_for_any_constants_it_draws() -> None:
    # "between" once drew no case for its bounds 5 and 6 (an empty range), which ended a generation of a few
    # thousand projects (an SFT run's training samples) with a ValueError.
    import random

    from agentfly.tasks.code_repair import FUNCTIONS

    for template in FUNCTIONS:
        for seed in range(3000):
            rng = random.Random(seed)
            constants = template.constants(rng)
            assert template.cases(rng, constants), (template.kind, constants)
