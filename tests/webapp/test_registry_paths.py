"""Registry paths name a function, not a walk: ``module:name`` resolves only to a top-level object defined in
the module it names. One test per attack of issue 28 that walked from a harmless shared plugin module (here
``hostile_tools``, which imports ``os`` and ``json``) to ``os.system``, ``os.popen``, the module's loader
(which read another team's plugin source) or ``json.codecs.open``, through every door: registration,
a stored row the worker inspects or tries, a job's config at start, and the child's own import.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from tests.webapp.factories import ready_entry
from tests.webapp.helpers import Worker, wait_for
from tests.webapp.test_registry_security import api_register, form_register, plugin_file, try_it
from webapp.registry.models import Entry, EntryStatus

CHAINS = ["hostile_tools:os.system", "hostile_tools:os.popen", "hostile_tools:__loader__.get_data",
          "hostile_tools:json.codecs.open"]
IMPORTED = "from os import system\nfrom json import loads as parse\n\n\ndef own(text: str) -> str:\n    return text\n"


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
