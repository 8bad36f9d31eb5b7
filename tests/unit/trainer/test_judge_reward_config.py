"""A reward that declares ``resource="judge"`` gets a judge pool from the trainer's config
(``resources.judge.spec``), and one step trains with it: the tiny judge's unparseable verdicts are each
trajectory's visible reward error and the judge's counted parse failures, in the step's resources event."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from agentfly.resources import judge_spec
from agentfly.rewards.builtin import rubric_judge
from trainer.builders import build_resources
from trainer.config import load_config

# What a config names as resources.judge.spec (the model folder comes from the test, through the environment).
JUDGE = judge_spec(model_dir=os.environ.get("AGENTFLY_TEST_JUDGE_DIR", "."), max_concurrency=2)


def test_the_reward_s_resource_gets_a_pool_and_one_not_configured_names_the_key_to_add(tmp_path: Path) -> None:
    config = load_config(None, [f"output_dir={tmp_path}", "resources.judge.spec=tests.unit.trainer."
                                "test_judge_reward_config:JUDGE"])
    resources = build_resources(config, [], rubric_judge)
    assert resources is not None and "judge" in resources
    assert resources.specs["judge"].kind == "model_service" and resources.specs["judge"].scope == "global"
    with pytest.raises(ValueError, match=r"resources\.judge\.spec"):
        build_resources(load_config(None, [f"output_dir={tmp_path}"]), [], rubric_judge)


@pytest.mark.timeout(600)
def test_a_step_with_a_judge_reward_records_each_unparseable_verdict(tiny_model_dir: Path, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    from trainer.events import CallbackSink
    from trainer.loop import Trainer

    monkeypatch.setenv("AGENTFLY_TEST_JUDGE_DIR", str(tiny_model_dir))
    importlib.reload(importlib.import_module("tests.unit.trainer.test_judge_reward_config"))
    config = load_config(None, [
        f"model.path={tiny_model_dir}", f"output_dir={tmp_path}", "steps=1", "threads=1", "progress=false",
        "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=8", "rollout.max_turns=1",
        "rollout.tools=[]", "data.train_size=8", "data.eval_size=2", "eval.max_new_tokens=4", "log_samples=-1",
        "rollout.max_reward_error_steps=0",  # the untrained judge's every verdict is unparseable: record, not stop
        "rollout.reward=agentfly.rewards.builtin:rubric_judge",
        "resources.judge.spec=tests.unit.trainer.test_judge_reward_config:JUDGE"])
    events: list[dict[str, Any]] = []
    Trainer(config, sinks=[CallbackSink(events.append)]).train()
    pools = [e["data"]["pools"] for e in events if e["type"] == "resources" and e["data"].get("pools")]
    assert pools and "judge" in pools[-1], pools
    service = pools[-1]["judge"]["service"]
    samples = [t for e in events if e["type"] == "samples" for t in e["data"]["trajectories"]]
    graded = [t for t in samples if t.get("final_answer")]
    assert service["calls"] == service["parse_failures"] >= len(graded) >= 1
    assert all("judge's reply" in (t.get("reward_error") or "") for t in graded)


def test_the_judge_section_makes_the_judge_pool_with_its_rubric_and_sampling(tmp_path: Path) -> None:
    config = load_config(None, [f"output_dir={tmp_path}", f"judge.model_dir={tmp_path}", "judge.rubric=Is it kind?",
                                "judge.max_concurrency=2", "judge.max_new_tokens=12"])
    resources = build_resources(config, [], rubric_judge)
    assert resources is not None and resources.specs["judge"].kind == "model_service"
    options = resources.specs["judge"].options
    assert options["rubric"] == "Is it kind?" and options["max_concurrency"] == 2
    assert options["engine"]["backend"] == "hf" and options["engine"]["model_dir"] == str(tmp_path)
    assert options["sampling"].max_new_tokens == 12 and options["sampling"].temperature == 0.0
    remote = load_config(None, [f"output_dir={tmp_path}", f"judge.model_dir={tmp_path}", "judge.backend=remote",
                                "judge.servers=[http://gpu3:8000]"])
    engine = build_resources(remote, [], rubric_judge).specs["judge"].options["engine"]  # type: ignore[union-attr]
    assert (engine["backend"], engine["servers"]) == ("remote", ["http://gpu3:8000"])


@pytest.mark.parametrize(("overrides", "key"), [
    (["judge.servers=[http://gpu3:8000]", "judge.model_dir=/m"], "judge.backend"),
    (["judge.backend=remote", "judge.model_dir=/m"], "judge.servers"),
    (["judge.backend=remote", "judge.servers=[http://gpu3:8000]"], "judge.model_dir"),
    (["judge.model_dir=/m", "judge.max_batch=0"], "judge.max_batch"),
    (["judge.model_dir=/m", "resources.judge.spec=tests.unit.trainer.test_judge_reward_config:JUDGE"],
     "resources.judge.spec"),
])
def test_a_judge_section_that_cannot_work_names_the_key_to_change(tmp_path: Path, overrides: list[str],
                                                                  key: str) -> None:
    from trainer.config import ConfigError

    with pytest.raises(ConfigError) as caught:
        load_config(None, [f"output_dir={tmp_path}", *overrides])
    assert caught.value.key == key, caught.value


def test_the_reward_model_section_makes_the_reward_model_pool(tmp_path: Path) -> None:
    import agentfly as af

    @af.reward(resource="reward_model")
    async def preferred(final_answer: str, context: Any) -> float:
        return 0.0

    config = load_config(None, [f"output_dir={tmp_path}", f"reward_model.model_dir={tmp_path}"])
    resources = build_resources(config, [], preferred)
    assert resources is not None and resources.specs["reward_model"].options["model_dir"] == str(tmp_path)
