"""A job from YAML for each task source trains two steps through the real ``agentfly train`` entry point on the
tiny model: a reasoning-gym dataset with its own scorer, TextWorld games (played in the pool when the model calls
``tw_act``: tests/integration/resources/test_textworld_env.py plays them), and a task a user's module defines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer.events import read_events

pytestmark = pytest.mark.slow

CASES = {
    "reasoning_gym": """
data: {task: "reasoning_gym:basic_arithmetic", options: {max_terms: 3}}
rollout: {tools: [agentfly.tools.builtin.calculator:calculator], reward: agentfly.rewards.builtin.reasoning_gym:rg_score}
""",
    "textworld": """
data: {task: "textworld:custom", options: {rooms: [1, 2], objects: 2, quest_length: 1}, train_size: 4}
rollout: {tools: [agentfly.tools.builtin.textworld:tw_act], reward: agentfly.rewards.builtin.env:env_score}
""",
    "module": """
data: {task: "my_tasks:numbers_up_to", options: {limit: 8}}
rollout: {tools: [], reward: agentfly.rewards.builtin.math:math_equal}
""",
}
MODULE = '''
from agentfly.tasks import Task

def numbers_up_to(limit):
    samples = lambda split, n, seed: [{"id": f"{split}{i}", "question": f"Say {i}.", "answer": str(i)}
                                      for i in range(min(n, limit))]
    return Task(name="numbers", title="Say a number", samples=samples, tools=(),
                reward="agentfly.rewards.builtin.math:math_equal")
'''


@pytest.mark.parametrize("source", list(CASES))
@pytest.mark.timeout(600)
def test_a_yaml_job_of_each_task_source_trains_two_steps(source: str, tiny_model_dir: Path, tmp_path: Path,
                                                        agentfly, tiny_overrides, monkeypatch) -> None:
    (tmp_path / "my_tasks.py").write_text(MODULE)
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{__import__('os').environ.get('PYTHONPATH', '')}")
    monkeypatch.setenv("AGENTFLY_TEXTWORLD_CACHE", str(tmp_path / "games"))
    (tmp_path / "job.yaml").write_text(CASES[source])
    out = tmp_path / "run"
    sets = tiny_overrides(tiny_model_dir, out)
    proc = agentfly("train", str(tmp_path / "job.yaml"), *[a for s in sets for a in ("--set", s)], timeout=540)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["step"] == 2 and result["state"] == "succeeded"
    samples = read_events(out / "events.jsonl", "samples")[0]["data"]["trajectories"]
    assert samples and samples[0]["segments"]
