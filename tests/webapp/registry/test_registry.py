"""The registry: entries imported and described on a real worker, never in the web process."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest
from django.urls import reverse

from tests.webapp.helpers import wait_for
from webapp.registry.models import Entry, EntryStatus, Version

pytestmark = pytest.mark.integration


def register(client: Any, team: Any, path: str, kind: str = "tool") -> Any:
    return client.post(reverse("registry:register"), {"kind": kind, "import_path": path, "team": team.pk})


def settled(entry_id: int) -> Entry | None:
    entry = Entry.objects.get(pk=entry_id)
    return entry if entry.status != EntryStatus.PENDING else None


def test_builtin_tools_and_rewards_appear_without_registration(alice_client: Any, builtins: dict[str, Any]) -> None:
    assert {"calculator", "math_equal"} <= set(builtins)
    calculator = builtins["calculator"]
    assert calculator.import_path == "agentfly.tools.builtin.calculator:calculator"
    assert calculator.current_version.schema["function"]["name"] == "calculator"
    page = alice_client.get(reverse("registry:list")).content.decode()
    assert "agentfly.tools.builtin.calculator:calculator" in page.replace("<wbr>", "") and "built-in" in page


def test_a_plugin_tool_is_imported_on_the_worker_and_described(alice_client: Any, team_a: Any, worker: Any,
                                                              transactional_db: None) -> None:
    response = register(alice_client, team_a, "team_tools:word_count")
    entry = Entry.objects.get(import_path="team_tools:word_count")
    assert response.status_code == 302
    entry = wait_for(lambda: settled(entry.pk), 30, "the worker to inspect the tool")
    assert entry.status == EntryStatus.READY, entry.error
    version = entry.current_version
    assert version.name == "word_count"
    assert version.signature == "word_count(text: str) -> int"
    assert version.docstring.startswith("Count the words in a text.")
    assert version.schema["function"]["parameters"]["properties"]["text"]["type"] == "string"
    assert len(version.source_hash) == 64
    # The web process itself never imported the plugin.
    assert "team_tools" not in sys.modules
    page = alice_client.get(reverse("registry:detail", args=[entry.pk])).content.decode()
    assert "word_count(text: str) -&gt; int" in page and version.source_hash in page


def test_a_reward_is_imported_on_the_worker_and_described(alice_client: Any, team_a: Any, worker: Any,
                                                          transactional_db: None) -> None:
    register(alice_client, team_a, "team_tools:length_penalty", kind="reward")
    penalty = wait_for(lambda: settled(Entry.objects.get(import_path="team_tools:length_penalty").pk), 30, "reward")
    assert penalty.status == EntryStatus.READY, penalty.error
    assert penalty.current_version.schema == {"required": ["final_answer"], "optional": [], "takes_all": False}


def test_a_module_that_fails_to_import_is_refused_with_the_error_shown(
        alice_client: Any, team_a: Any, worker: Any, transactional_db: None) -> None:
    path, message = "broken_plugin:anything", "No module named 'a_package_that_is_not_installed'"
    register(alice_client, team_a, path)
    entry = wait_for(lambda: settled(Entry.objects.get(import_path=path).pk), 30, "the inspection")
    assert entry.status == EntryStatus.FAILED
    assert message in entry.error
    assert entry.current_version is None
    page = alice_client.get(reverse("registry:detail", args=[entry.pk])).content.decode()
    assert "could not use this path" in page and message.replace("'", "&#x27;") in page


def test_a_changed_source_becomes_a_new_version_and_the_old_one_is_kept(
        alice_client: Any, team_a: Any, worker: Any, transactional_db: None, tmp_path: Any) -> None:
    from django.conf import settings

    plugin = next(iter(settings.AGENTFLY_PLUGIN_DIRS)) / "edited_plugin.py"
    plugin.write_text("from agentfly.tools import tool\n\n@tool\ndef greet(name: str) -> str:\n"
                      "    \"\"\"Greet someone.\"\"\"\n    return 'hi ' + name\n")
    try:
        register(alice_client, team_a, "edited_plugin:greet")
        entry = wait_for(lambda: settled(Entry.objects.get(import_path="edited_plugin:greet").pk), 30, "v1")
        first = entry.current_version
        plugin.write_text(plugin.read_text().replace("'hi '", "'hello '"))
        alice_client.post(reverse("registry:reinspect", args=[entry.pk]))
        entry = wait_for(lambda: settled(entry.pk), 30, "v2")
        assert entry.current_version.source_hash != first.source_hash
        assert set(Version.objects.filter(entry=entry).values_list("pk", flat=True)) == {first.pk, entry.current_version.pk}
    finally:
        plugin.unlink()


def test_try_it_calls_the_tool_on_a_worker_and_shows_the_observation(alice_client: Any,
                                                                     builtins: dict[str, Any]) -> None:
    calculator = builtins["calculator"]
    response = alice_client.post(reverse("registry:try", args=[calculator.pk]), {"arguments": '{"expression": "12*3+4"}'})
    assert response.status_code == 200
    assert response.context["result"]["observation"] == "40"
    bad = alice_client.post(reverse("registry:try", args=[calculator.pk]), {"arguments": '{"expression": 5}'})
    assert bad.context["result"]["error"]  # the tool's own argument validation, as a rollout would see it


def test_try_it_runs_a_builtin_tool_on_a_sample_of_its_task_with_the_fields_it_reads(
        alice_client: Any, builtins: dict[str, Any]) -> None:
    # lookup reads its chain from the task sample ("start", "links", "answer"): on an empty sample it answered
    # KeyError: 'start'. It is tried on the key chain's first sample, which the answer shows.
    lookup = builtins["lookup"]
    result = alice_client.post(reverse("registry:try", args=[lookup.pk]), {"arguments": '{"key": "k1"}'}).context["result"]
    assert result["sample"]["task"] == "key_chain" and "start" in result["sample"]["fields"], result
    start = result["sample"]["fields"]["start"]
    assert "KeyError" not in (result["error"] or "") and "look up the key you were last given" in result["error"]
    followed = alice_client.post(reverse("registry:try", args=[lookup.pk]),
                                 {"arguments": json.dumps({"key": start})})
    assert followed.context["result"]["observation"].startswith(("next: k", "final: "))
    assert "Run on the first sample of the <code>key_chain</code> task" in followed.content.decode()


def test_try_it_names_the_sample_field_a_team_tool_reads_that_no_sample_gives(
        alice_client: Any, team_a: Any, worker: Any, transactional_db: None) -> None:
    register(alice_client, team_a, "team_tools:city_weather")
    entry = wait_for(lambda: settled(Entry.objects.get(import_path="team_tools:city_weather").pk), 30, "inspection")
    assert entry.status == EntryStatus.READY, entry.error
    result = alice_client.post(reverse("registry:try", args=[entry.pk]), {"arguments": '{"day": "monday"}'}
                               ).context["result"]
    assert "this tool reads the task sample's 'city' field" in result["error"], result
    assert result["sample"] is None


@pytest.mark.parametrize(("arguments", "message"), [
    ("{not json", "arguments are not valid JSON"),
    ("[1, 2]", "arguments must be a JSON object"),
])
def test_try_it_refuses_arguments_that_are_not_a_json_object(alice_client: Any, builtins: dict[str, Any],
                                                             arguments: str, message: str) -> None:
    response = alice_client.post(reverse("registry:try", args=[builtins["calculator"].pk]), {"arguments": arguments})
    assert response.status_code == 400
    assert message in response.content.decode()


def test_try_it_through_the_api(alice_api: Any, builtins: dict[str, Any]) -> None:
    url = f"/api/registry/{builtins['calculator'].pk}/try/"
    assert alice_api.post(url, {"arguments": {"expression": "2+2"}}, format="json").json()["observation"] == "4"
    assert alice_api.post(url, {"arguments": "2+2"}, format="json").status_code == 400
    reward_url = f"/api/registry/{builtins['math_equal'].pk}/try/"
    assert alice_api.post(reward_url, {"arguments": {}}, format="json").status_code == 400


def test_try_it_runs_a_sandboxed_tool_inside_its_sandbox(alice_client: Any, builtins: dict[str, Any]) -> None:
    from tests.webapp.helpers import ROOT

    python_code = builtins["python_code"]
    assert python_code.current_version.resource == "python"
    response = alice_client.post(reverse("registry:try", args=[python_code.pk]),
                                 {"arguments": '{"code": "import os\\nprint(6 * 7)\\nprint(os.getcwd())"}'})
    result = response.context["result"]
    assert result["error"] is None, result
    answer, cwd = result["observation"].strip().splitlines()
    assert answer == "42"
    assert cwd != str(ROOT)  # it ran in the sandbox's own directory, not the worker's
