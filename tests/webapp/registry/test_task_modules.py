"""A job may name its task as 'module:attribute' only where the registry's rules allow code: a Task made at the
top of a module in the team's own plugin folder or a shared one; anything else is refused before any import,
at launch and on the worker alike (both call ``check_job_config``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from webapp.jobs import paths
from webapp.registry.rules import NotRegistrable, check_job_config

TASKS = '''
from agentfly.tasks import Task

numbers = Task(name="numbers", title="Say a number", tools=(), reward="agentfly.rewards.builtin.math:math_equal",
               samples=lambda split, n, seed: [{"question": "Say 1.", "answer": "1"}])

def make(limit):
    return numbers
'''


def job(task: str) -> dict[str, Any]:
    return {"data": {"task": task}, "rollout": {"tools": [], "reward": "agentfly.rewards.builtin.math:math_equal"}}


@pytest.fixture
def team_folder(settings: Any, tmp_path: Path) -> Path:
    settings.AGENTFLY_PLUGIN_DIRS = [tmp_path]
    (tmp_path / "team-a").mkdir()
    (tmp_path / "team-a" / "my_tasks.py").write_text(TASKS)
    return tmp_path / "team-a"


def test_a_task_made_in_the_team_s_plugin_folder_is_allowed(team_folder: Path, db: None) -> None:
    check_job_config(job("agentfly_teams.team_a.my_tasks:numbers"), "team-a")


@pytest.mark.parametrize(("task", "words"), [
    ("os:system", "not registrable code"),
    ("agentfly_teams.team_a.my_tasks:make", "not a Task made at the top"),
    ("agentfly_teams.team_b.my_tasks:numbers", "not in your team's plugin folder"),
    ("agentfly_teams.team_a.my_tasks:missing", "bound as `missing = Task"),
])
def test_a_task_module_the_rules_do_not_allow_is_refused_before_any_import(team_folder: Path, db: None, task: str,
                                                                          words: str) -> None:
    with pytest.raises(NotRegistrable, match=words):
        check_job_config(job(task), "team-a")


def test_a_task_source_is_no_path_and_needs_no_plugin(team_folder: Path, db: None) -> None:
    for task in ("reasoning_gym:chain_sum", "textworld:cooking", "agentfly_teams.team_a.my_tasks:numbers"):
        assert ("data.task", task) not in paths.config_paths(job(task))
        check_job_config(job(task), "team-a")
    assert ("data.task", "runs/x.jsonl") in paths.config_paths(job("runs/x.jsonl"))
