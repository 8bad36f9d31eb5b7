"""Registry paths name a function, not a walk: ``module:name`` resolves only to a top-level object defined in
the module it names and decorated as a tool or reward. One test per attack of issue 28 that walked from a
harmless shared plugin module (here ``hostile_tools``, which imports ``os`` and ``json``) to ``os.system``,
``os.popen``, the module's loader (which read another team's plugin source) or ``json.codecs.open``, and
per undecorated function, through every door: registration, the launch form, a stored row the worker
sweeps, inspects or tries, a job's config at start, and the child's own import. The shipped built-ins,
the examples' configs and the demo's example tool pass the same rule.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.urls import reverse

from tests.webapp.factories import builtin_entries, launch_data, ready_entry
from tests.webapp.helpers import ROOT, Worker, wait_for
from tests.webapp.registry.test_registry_security import api_register, form_register, plugin_file, try_it
from webapp.registry.models import Entry, EntryStatus

CHAINS = ["hostile_tools:os.system", "hostile_tools:os.popen", "hostile_tools:__loader__.get_data",
          "hostile_tools:json.codecs.open"]
IMPORTED = ("from os import system\nfrom json import loads as parse\n\nfrom agentfly.tools import tool\n\n\n"
            "@tool\ndef own(text: str) -> str:\n    return text\n")
PLAIN = "def shout(text: str) -> str:\n    \"\"\"Shout.\"\"\"\n    return text.upper()\n"


@pytest.mark.parametrize("path", CHAINS)
def test_an_attribute_chain_is_refused_at_registration_with_the_fix_named(
        alice_api: Any, alice_client: Any, team_a: Any, path: str) -> None:
    response = api_register(alice_api, path)
    assert response.status_code == 400
    message = " ".join(response.json()["import_path"])
    assert "walks an attribute chain" in message and "hostile_tools:<function>" in message
    assert "register that function" in message
    page = form_register(alice_client, team_a, path)
    assert page.status_code == 400 and "walks an attribute chain" in " ".join(page.context["form"].errors["import_path"])
    assert not Entry.objects.exists()


def test_a_function_imported_into_a_plugin_module_is_refused_at_registration(alice_api: Any, team_a: Any) -> None:
    with plugin_file("imports_os.py", IMPORTED):
        for path in ("imports_os:system", "imports_os:parse"):
            response = api_register(alice_api, path)
            assert response.status_code == 400, path
            assert "is imported into 'imports_os', not defined there" in response.json()["import_path"][0]
        assert api_register(alice_api, "imports_os:own").status_code == 202


@pytest.mark.parametrize("path", [*CHAINS, "imports_os:system"])
def test_the_childs_loader_refuses_a_walk_or_an_imported_function(path: str) -> None:
    from webapp.registry.introspect import IntrospectionError, describe

    with plugin_file("imports_os.py", IMPORTED), pytest.raises(IntrospectionError) as refused:
        describe("tool", path, plugin_dirs=[str(Path(settings.AGENTFLY_PLUGIN_DIRS[0]))])
    assert "register that function" in str(refused.value)


def test_stored_attribute_chains_fail_on_the_worker_and_at_try(
        alice_api: Any, team_a: Any, worker: Worker, transactional_db: None) -> None:
    from webapp.registry.tasks import inspect_entry

    for path in CHAINS:
        entry = ready_entry(team_a, "tool", path, "walk")  # as the admin or a shell could make it
        result = try_it(alice_api, entry, {"command": "id"}).json()
        assert result["observation"] == "" and "walks an attribute chain" in result["error"], (path, result)
        inspect_entry.apply_async(args=[entry.pk], queue="cpu").get(timeout=60)
        entry.refresh_from_db()
        assert entry.status == EntryStatus.FAILED and "walks an attribute chain" in entry.error


def test_a_job_whose_config_walks_to_os_system_fails_at_start(
        alice: Any, team_a: Any, worker: Worker, transactional_db: None) -> None:
    from webapp.jobs import actions
    from webapp.jobs.models import Status, TrainingJob

    config = {"steps": 1, "rollout": {"tools": ["hostile_tools:os.system"],
                                      "reward": "agentfly.rewards.builtin.math:math_equal"}}
    job, _ = actions.do_launch_job(user=alice, team=team_a, name="walk", config=config, queue="cpu",
                                   tool_versions=[], reward_version=None)
    job = wait_for(lambda: TrainingJob.objects.filter(pk=job.pk, status=Status.FAILED).first(), 60, "the job to fail")
    assert "walks an attribute chain" in job.error


# ------------------------------------------------------------------------------ decorated as a tool or reward
@pytest.mark.parametrize(("path", "kind"), [("team_tools:shout", "tool"), ("team_tools:shout", "reward"),
                                            ("agentfly_teams.team_a.plain:shout", "tool")])
def test_a_plain_function_is_refused_at_registration_with_the_decorator_named(
        alice_api: Any, alice_client: Any, team_a: Any, path: str, kind: str) -> None:
    with plugin_file("team-a/plain.py", PLAIN):
        response = api_register(alice_api, path, kind=kind)
        assert response.status_code == 400
        message = response.json()["import_path"][0]
        assert f"not an object decorated with @agentfly.{kind}" in message
        assert f"from agentfly.{kind}s import {kind}" in message and f"`@{kind}`" in message
        page = form_register(alice_client, team_a, path, kind=kind)
        assert page.status_code == 400
        assert f"@agentfly.{kind}" in " ".join(page.context["form"].errors["import_path"])
    assert not Entry.objects.exists()


def test_a_tool_registered_as_a_reward_is_refused_naming_its_kind(alice_api: Any, team_a: Any) -> None:
    tool = api_register(alice_api, "team_tools:word_count", kind="reward")
    assert tool.status_code == 400
    assert "decorated as a tool, not a reward" in tool.json()["import_path"][0]
    reward = api_register(alice_api, "team_tools:length_penalty", kind="tool")
    assert reward.status_code == 400
    assert "decorated as a reward, not a tool" in reward.json()["import_path"][0]
    assert api_register(alice_api, "team_tools:length_penalty", kind="reward").status_code == 202


@pytest.mark.parametrize(("path", "message"), [
    ("team_tools:missing_function", "'team_tools' defines no top-level 'missing_function'"),
    ("team_tools:NOT_A_TOOL", "not an object decorated with @agentfly.tool"),
])
def test_a_name_that_is_no_decorated_function_of_the_module_is_refused_at_registration(
        alice_api: Any, team_a: Any, path: str, message: str) -> None:
    response = api_register(alice_api, path)
    assert response.status_code == 400 and message in response.json()["import_path"][0]


def test_a_module_that_is_not_python_is_refused_at_registration_naming_the_error(alice_api: Any, team_a: Any) -> None:
    with plugin_file("half_written.py", "@tool\ndef count(text: str) -> int\n"):
        response = api_register(alice_api, "half_written:count")
    assert response.status_code == 400
    assert "cannot be read as Python (SyntaxError" in response.json()["import_path"][0]


def test_the_launch_form_refuses_a_stored_plain_function(alice_client: Any, team_a: Any) -> None:
    from webapp.jobs.models import TrainingJob

    _, math_equal = builtin_entries()
    shout = ready_entry(team_a, "tool", "team_tools:shout", "shout")  # as the admin or an old row could make it
    response = alice_client.post(reverse("jobs:launch"), launch_data(team_a, shout, math_equal))
    assert response.status_code == 400
    assert "not an object decorated with @agentfly.tool" in " ".join(response.context["form"].errors["tools"])
    assert not TrainingJob.objects.exists()


def test_the_sweep_at_worker_start_marks_a_stored_plain_function_failed(team_a: Any) -> None:
    from webapp.registry.worker import fail_unregistrable_entries

    shout = ready_entry(team_a, "tool", "team_tools:shout", "shout")
    fine = ready_entry(team_a, "tool", "team_tools:word_count", "word_count")
    assert fail_unregistrable_entries() == [shout.pk]
    shout.refresh_from_db()
    assert shout.status == EntryStatus.FAILED and "decorated with @agentfly.tool" in shout.error
    fine.refresh_from_db()
    assert fine.status == EntryStatus.READY


@pytest.mark.parametrize(("kind", "name", "message"), [
    ("tool", "shout", "is a function, not a tool decorated with @agentfly.tool"),
    ("tool", "NOT_A_TOOL", "is a int, not a tool decorated with @agentfly.tool"),
    ("reward", "count", "is a tool, not a reward: register it as a tool entry"),
])
def test_the_childs_loader_refuses_what_is_not_decorated_as_its_kind(kind: str, name: str, message: str) -> None:
    from webapp.registry.introspect import IntrospectionError, describe

    # A module of its own: the tests' own plugin modules must stay unimported in this (the web) process.
    text = PLAIN + "\n\nNOT_A_TOOL = 42\n\n\n" + IMPORTED.replace("def own", "def count")
    with plugin_file("loader_kinds.py", text), pytest.raises(IntrospectionError) as refused:
        describe(kind, f"loader_kinds:{name}", plugin_dirs=[str(Path(settings.AGENTFLY_PLUGIN_DIRS[0]))])
    assert message in str(refused.value)


def test_a_stored_plain_function_fails_on_the_worker_at_try_and_at_job_start(
        alice: Any, alice_api: Any, team_a: Any, worker: Worker, transactional_db: None) -> None:
    from webapp.jobs import actions
    from webapp.jobs.models import Status, TrainingJob
    from webapp.registry.tasks import inspect_entry

    shout = ready_entry(team_a, "tool", "team_tools:shout", "shout")
    result = try_it(alice_api, shout, {"text": "hi"}).json()
    assert result["observation"] == "" and "decorated with @agentfly.tool" in result["error"], result
    inspect_entry.apply_async(args=[shout.pk], queue="cpu").get(timeout=60)
    shout.refresh_from_db()
    assert shout.status == EntryStatus.FAILED and "decorated with @agentfly.tool" in shout.error

    config = {"steps": 1, "rollout": {"tools": ["team_tools:shout"],
                                      "reward": "agentfly.rewards.builtin.math:math_equal"}}
    job, _ = actions.do_launch_job(user=alice, team=team_a, name="plain", config=config, queue="cpu",
                                   tool_versions=[], reward_version=None)
    job = wait_for(lambda: TrainingJob.objects.filter(pk=job.pk, status=Status.FAILED).first(), 60, "the job to fail")
    assert "not an object decorated with @agentfly.tool" in job.error


# ---------------------------------------------------------------------------- what ships passes the rule
def test_every_builtin_and_every_example_configs_tools_and_reward_pass_the_rule() -> None:
    import yaml

    from webapp.registry.introspect import builtin_paths
    from webapp.registry.rules import check_registrable

    named = set(builtin_paths())
    for config in sorted((ROOT / "examples").glob("*/*.yaml")):
        rollout = (yaml.safe_load(config.read_text()) or {}).get("rollout") or {}
        named |= {("tool", path) for path in rollout.get("tools") or []}
        named |= {("reward", rollout["reward"])} if rollout.get("reward") else set()
    assert ("tool", "agentfly.tools.builtin.calculator:calculator") in named and len(named) > 10
    for kind, path in sorted(named):
        assert check_registrable(kind, path, None).origin == "package", path


def test_the_demos_example_team_tool_is_registrable_and_an_old_undecorated_one_is_replaced(
        settings: Any, tmp_path: Path, db: None) -> None:
    from webapp.demo import DEMO_TEAM, EXAMPLE_TEAM_TOOL, UNDECORATED_EXAMPLE, write_example_tool
    from webapp.registry.rules import NotRegistrable, check_registrable

    settings.AGENTFLY_PLUGIN_DIRS = [tmp_path]
    path = "agentfly_teams.demo_team.word_tools:count"
    old = tmp_path / DEMO_TEAM / "word_tools.py"
    old.parent.mkdir()
    old.write_text(UNDECORATED_EXAMPLE)  # what an older demo's --dir holds
    with pytest.raises(NotRegistrable, match=r"not an object decorated with @agentfly\.tool"):
        check_registrable("tool", path, DEMO_TEAM)
    assert write_example_tool(tmp_path / DEMO_TEAM).read_text() == EXAMPLE_TEAM_TOOL
    assert check_registrable("tool", path, DEMO_TEAM).origin == "plugin"
    old.write_text(EXAMPLE_TEAM_TOOL + "# the user's own edit\n")
    write_example_tool(tmp_path / DEMO_TEAM)
    assert old.read_text().endswith("# the user's own edit\n")  # a file the user changed is theirs
