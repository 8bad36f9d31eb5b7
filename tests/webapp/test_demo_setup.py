"""`python -m webapp.demo` as a newcomer meets it: it runs with DEBUG off (a bad address is the app's own 404
page, never Django's list of URLs) and still serves its static files over plain HTTP; its team has a plugin
folder with the guide's example tool; and a restart reuses the job a previous run left queued instead of
queueing a second one."""

from __future__ import annotations

import os
import signal
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.webapp.factories import builtin_entries
from tests.webapp.test_demo_stop import start_demo_in_background, wait_for_url


@pytest.mark.slow
def test_the_demo_runs_with_debug_off_serves_its_pages_and_sets_up_a_team_plugin_folder(tmp_path: Path) -> None:
    proc, port = start_demo_in_background(tmp_path)
    try:
        wait_for_url(proc)
        base = f"http://127.0.0.1:{port}"
        with pytest.raises(urllib.error.HTTPError) as answer:
            urllib.request.urlopen(f"{base}/jobs/not-a-job/", timeout=10)
        page = answer.value.read().decode()
        assert answer.value.code == 404
        assert "Not found" in page and "URLconf" not in page and "DEBUG = True" not in page
        with urllib.request.urlopen(f"{base}/login/", timeout=10) as login:
            assert "/static/" in login.read().decode()
        with urllib.request.urlopen(f"{base}/static/monitor/monitor.js", timeout=10) as script:
            assert script.status == 200
        tool = tmp_path / "plugins" / "demo-team" / "word_tools.py"
        assert "@tool\ndef count(text: str) -> int:" in tool.read_text()
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            proc.wait(20)
        for p in psutil.Process().children(recursive=True):
            p.kill()


def test_a_restarted_demo_reuses_its_queued_job_and_replaces_one_whose_worker_stopped(db: None) -> None:
    from webapp.demo import demo_user, launch_demo_job
    from webapp.jobs.models import Status, TrainingJob

    builtin_entries()
    user, team = demo_user()
    first = launch_demo_job(user, team, 2, None, "calculator")
    assert launch_demo_job(user, team, 2, None, "calculator").pk == first.pk  # restarted while it waited: the same job
    assert TrainingJob.objects.filter(team=team).count() == 1
    TrainingJob.objects.filter(pk=first.pk).update(status=Status.RUNNING)  # its worker stopped with the demo
    second = launch_demo_job(user, team, 2, None, "calculator")
    assert second.pk != first.pk and second.status == Status.QUEUED
    first.refresh_from_db()
    assert first.cancel_requested
    assert TrainingJob.objects.filter(team=team, status=Status.QUEUED).count() == 1


def test_the_demo_team_is_one_name(db: None) -> Any:
    from webapp.demo import demo_user

    _, team = demo_user()
    assert team.name == team.slug == "demo-team"


def test_the_key_chain_demo_launches_the_multi_turn_task_with_its_pooled_store(db: None) -> None:
    from tests.webapp.factories import ready_entry
    from webapp.demo import KEY_CHAIN_WARM_START, demo_user, launch_demo_job
    from webapp.registry.models import Kind

    ready_entry(None, Kind.TOOL, "agentfly.tools.builtin.lookup:lookup", "lookup")
    ready_entry(None, Kind.REWARD, "agentfly.rewards.builtin.chain:chain_answer", "chain_answer")
    user, team = demo_user()
    job = launch_demo_job(user, team, 200, KEY_CHAIN_WARM_START, "key_chain")
    assert job.config["data"]["task"] == "key_chain" and job.config["rollout"]["max_turns"] == 6
    assert job.config["rollout"]["tools"] == ["agentfly.tools.builtin.lookup:lookup"]
    assert job.config["resources"] == {"kv": {"max": 8}} and job.config["model"]["path"].endswith("key_chain/warm_start")
    assert job.config["eval"]["every"] > 0


def test_the_demo_runs_the_key_chain_from_its_warm_start_unless_told_otherwise(tmp_path: Path, capsys: Any) -> None:
    from webapp.demo import KEY_CHAIN_WARM_START, main, resolve_model

    assert resolve_model("warm", "key_chain", tmp_path, tmp_path) == KEY_CHAIN_WARM_START
    assert resolve_model("tiny", "key_chain", tmp_path, tmp_path) is None
    with pytest.raises(SystemExit):
        main(["--help"])  # argparse prints the help and exits
    assert "multi-turn key chain with its pooled store (default" in " ".join(capsys.readouterr().out.split())


def test_the_tiny_key_chain_demo_trains_the_untrained_model_on_the_same_task(db: None) -> None:
    from tests.webapp.factories import ready_entry
    from webapp.demo import demo_user, launch_demo_job
    from webapp.registry.models import Kind

    ready_entry(None, Kind.TOOL, "agentfly.tools.builtin.lookup:lookup", "lookup")
    ready_entry(None, Kind.REWARD, "agentfly.rewards.builtin.chain:chain_answer", "chain_answer")
    user, team = demo_user()
    job = launch_demo_job(user, team, 2, None, "key_chain")
    assert job.config["data"]["task"] == "key_chain" and job.config["resources"] == {"kv": {"max": 8}}
    assert job.config["model"]["build_tiny"] and job.config["rollout"]["max_turns"] == 2


def test_the_calculator_demo_draws_its_evaluation_as_a_curve(db: None) -> None:
    from webapp.demo import demo_user, launch_demo_job

    builtin_entries()
    user, team = demo_user()
    assert launch_demo_job(user, team, 200, None, "calculator").config["eval"]["every"] == 25
