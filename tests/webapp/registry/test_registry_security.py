"""Only registrable code is registered, and user code can neither take the worker down nor read its secrets.

One test per attack of issue 13: dangerous import paths refused at registration (without importing them),
symlinks out of a plugin folder, another team's folder, stored rows and job configs that name refused code,
and tools that exit, hang or look for secrets on a real worker.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.urls import reverse

from tests.webapp.factories import builtin_entries, launch_data, ready_entry
from tests.webapp.helpers import Worker, wait_for, worker_env
from webapp.registry.models import Entry, EntryStatus

PLUGINS = Path(settings.AGENTFLY_PLUGIN_DIRS[0])
DANGEROUS = ["os:system", "subprocess:getoutput", "builtins:eval", "builtins:open", "shutil:rmtree", "os:popen",
             "posix:system", "os:_exit", "no_such_module_anywhere:tool",
             "django.core.management:call_command"]  # a plain function of an installed package


def api_register(api: Any, path: str, team: str = "team-a", kind: str = "tool") -> Any:
    return api.post("/api/registry/", {"kind": kind, "import_path": path, "team": team}, format="json")


def form_register(client: Any, team: Any, path: str, kind: str = "tool") -> Any:
    return client.post(reverse("registry:register"), {"kind": kind, "import_path": path, "team": team.pk})


def settled(entry_id: int) -> Entry | None:
    entry = Entry.objects.get(pk=entry_id)
    return entry if entry.status != EntryStatus.PENDING else None


def registered(api: Any, path: str) -> Entry:
    """Register ``path`` for team A through the API and wait until the worker has inspected it."""
    response = api_register(api, path)
    assert response.status_code == 202, response.content
    entry = wait_for(lambda: settled(response.json()["id"]), 30, f"the worker to inspect {path}")
    assert entry.status == EntryStatus.READY, entry.error
    return entry


def try_it(api: Any, entry: Entry, arguments: dict[str, Any]) -> Any:
    return api.post(f"/api/registry/{entry.pk}/try/", {"arguments": arguments}, format="json")


@contextlib.contextmanager
def plugin_file(relative: str, text: str = "", link_to: Path | None = None) -> Iterator[Path]:
    """A file (or a symlink) in the session worker's plugin folder, removed afterwards."""
    path = PLUGINS / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    if link_to is not None:
        path.symlink_to(link_to)
    else:
        path.write_text(text)
    try:
        yield path
    finally:
        path.unlink()
        if path.parent != PLUGINS:
            with contextlib.suppress(OSError):  # another file of the same team folder is still there
                path.parent.rmdir()


# ------------------------------------------------------------------------------------ at registration
@pytest.mark.parametrize("path", DANGEROUS)
def test_registering_os_system_is_refused_with_the_setting_named(alice_api: Any, alice_client: Any, team_a: Any,
                                                                  path: str) -> None:
    response = api_register(alice_api, path)
    assert response.status_code == 400
    message = " ".join(response.json()["import_path"])
    assert "AGENTFLY_PLUGIN_DIRS" in message and "AGENTFLY_TOOL_PACKAGES" in message
    page = form_register(alice_client, team_a, path)
    assert page.status_code == 400
    assert "AGENTFLY_PLUGIN_DIRS" in " ".join(page.context["form"].errors["import_path"])
    assert not Entry.objects.exists()


def test_registering_a_plain_function_among_the_built_ins_is_refused_as_undecorated(alice_api: Any, alice_client: Any,
                                                                                     team_a: Any) -> None:
    path = "agentfly.tools.builtin.calculator:evaluate_arithmetic"  # allowed package, but not a @tool
    response = api_register(alice_api, path)
    assert response.status_code == 400
    message = " ".join(response.json()["import_path"])
    assert "not an object decorated with @agentfly.tool" in message and "AGENTFLY_PLUGIN_DIRS" in message
    page = form_register(alice_client, team_a, path)
    assert page.status_code == 400
    assert "decorated" in " ".join(page.context["form"].errors["import_path"])
    assert not Entry.objects.exists()


def test_a_refused_path_is_judged_without_importing_it(alice_api: Any, team_a: Any) -> None:
    # Importing antigravity opens a web browser; `this` prints a poem: neither may run in the web process.
    for module in ("antigravity", "this"):
        assert module not in sys.modules
        assert api_register(alice_api, f"{module}:x").status_code == 400
        assert module not in sys.modules


def test_only_decorated_objects_of_a_package_in_agentfly_tool_packages_are_registrable(
        alice_api: Any, team_a: Any, settings: Any) -> None:
    path = "tests.webapp.plugins.team_tools"
    refused = api_register(alice_api, f"{path}:word_count")
    assert refused.status_code == 400 and "AGENTFLY_TOOL_PACKAGES" in refused.json()["import_path"][0]
    settings.AGENTFLY_TOOL_PACKAGES = ["tests.webapp.plugins"]
    assert api_register(alice_api, f"{path}:word_count").status_code == 202  # @tool
    assert api_register(alice_api, f"{path}:length_penalty", kind="reward").status_code == 202  # @reward
    plain = api_register(alice_api, f"{path}:shout")  # a plain function: only plugin folders may hold those
    assert plain.status_code == 400 and "not an object decorated with @agentfly.tool" in plain.json()["import_path"][0]
    assert path not in sys.modules


def test_a_plugin_symlink_that_escapes_the_folder_is_refused(alice_api: Any, team_a: Any, tmp_path: Path) -> None:
    outside = tmp_path / "outside.py"
    outside.write_text("def run(cmd: str) -> str:\n    return cmd\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "mod.py").write_text(outside.read_text())
    with plugin_file("escaping_file.py", link_to=outside), plugin_file("escaping_dir", link_to=tmp_path / "pkg"):
        for path in ("escaping_file:run", "escaping_dir.mod:run"):
            response = api_register(alice_api, path)
            assert response.status_code == 400, path
            message = response.json()["import_path"][0]
            assert "outside the plugin folder" in message and "AGENTFLY_PLUGIN_DIRS" in message
    assert not Entry.objects.exists()


def test_team_b_cannot_register_from_team_a_folder(alice_api: Any, bob_api: Any, team_a: Any, team_b: Any) -> None:
    whisper = "from agentfly.tools import tool\n\n\n@tool\ndef whisper() -> str:\n    return 'team a only'\n"
    with plugin_file("team-a/secrets.py", whisper):
        path = "agentfly_teams.team_a.secrets:whisper"
        refused = api_register(bob_api, path, team="team-b")
        assert refused.status_code == 400
        message = refused.json()["import_path"][0]
        assert "another team's folder" in message and "agentfly_teams.team_b.<module>" in message
        assert api_register(alice_api, path).status_code == 202
    assert list(Entry.objects.values_list("team__slug", flat=True)) == ["team-a"]


def test_two_teams_same_named_modules_import_apart_on_a_worker_and_in_the_trainer(
        alice_api: Any, team_a: Any, team_b: Any, worker: Worker, transactional_db: None) -> None:
    from trainer.builders import import_object
    from webapp.registry.introspect import add_plugin_dirs

    tool = "from agentfly.tools import tool\n\n@tool\ndef motto() -> str:\n    \"\"\"The team's motto.\"\"\"\n    return {!r}\n"
    with plugin_file("team-a/mottos.py", tool.format("A first")), plugin_file("team-b/mottos.py", tool.format("B best")):
        entry = registered(alice_api, "agentfly_teams.team_a.mottos:motto")  # imported in the worker's child
        assert entry.current_version.name == "motto"
        assert try_it(alice_api, entry, {}).json()["observation"] == "A first"
        add_plugin_dirs()  # what a job's worker does before the trainer imports rollout.tools
        a = import_object("agentfly_teams.team_a.mottos:motto", "rollout.tools entry")
        b = import_object("agentfly_teams.team_b.mottos:motto", "rollout.tools entry")
        assert (a.fn(), b.fn()) == ("A first", "B best")


# ----------------------------------------------------------------------------- rows made behind the API
def test_a_stored_entry_the_rule_refuses_is_marked_failed_when_a_worker_starts(
        alice: Any, team_a: Any, worker: Worker, runs_dir: Path, tmp_path: Path, transactional_db: None) -> None:
    from webapp.jobs.forms import LaunchForm

    system = ready_entry(team_a, "tool", "os:system", "system")  # as the admin or a shell could make it
    evil_builtin = ready_entry(None, "tool", "builtins:eval", "eval")
    fine = ready_entry(team_a, "tool", "team_tools:word_count", "word_count")
    second = Worker("gpu", worker_env(runs_dir), tmp_path / "second-worker.log")
    try:
        second.wait_ready()
        wait_for(lambda: Entry.objects.get(pk=system.pk).status == EntryStatus.FAILED, 30, "the sweep")
    finally:
        second.stop()
    for refused in (system, evil_builtin):
        refused.refresh_from_db()
        assert refused.status == EntryStatus.FAILED
        assert "is not registrable code" in refused.error and "AGENTFLY_PLUGIN_DIRS" in refused.error
    fine.refresh_from_db()
    assert fine.status == EntryStatus.READY
    offered = LaunchForm(user=alice).fields["tools"].queryset
    assert fine in offered and system not in offered and evil_builtin not in offered


def test_a_job_whose_config_names_os_system_is_refused_at_launch_and_at_start(
        alice: Any, alice_client: Any, team_a: Any, worker: Worker, transactional_db: None) -> None:
    from webapp.jobs import actions
    from webapp.jobs.models import Status, TrainingJob

    _, math_equal = builtin_entries()
    system = ready_entry(team_a, "tool", "os:system", "system")
    response = alice_client.post(reverse("jobs:launch"), launch_data(team_a, system, math_equal))
    assert response.status_code == 400
    assert "AGENTFLY_PLUGIN_DIRS" in " ".join(response.context["form"].errors["tools"])
    assert not TrainingJob.objects.exists()

    # A job row made behind the form (a shell, an old row) is refused by the worker before it imports.
    config = {"steps": 1, "rollout": {"tools": ["os:system"], "reward": "agentfly.rewards.builtin.math:math_equal"}}
    job, _ = actions.do_launch_job(user=alice, team=team_a, name="behind the form", config=config, queue="cpu",
                                   tool_versions=[], reward_version=None)
    job = wait_for(lambda: TrainingJob.objects.filter(pk=job.pk, status=Status.FAILED).first(), 60, "the job to fail")
    assert "os:system is not registrable code" in job.error and "AGENTFLY_PLUGIN_DIRS" in job.error


# ----------------------------------------------------------------------------- user code on the worker
def received(worker: Worker, task: str) -> int:
    return sum(1 for line in worker.log.read_text().splitlines() if f"Task {task}[" in line and "received" in line)


def test_a_tool_that_calls_os_exit_fails_once_and_is_not_redelivered(
        alice_api: Any, team_a: Any, worker: Worker, transactional_db: None) -> None:
    from webapp.registry.tasks import inspect_entry, sync_builtins, try_tool

    assert all(t.acks_late is False and t.reject_on_worker_lost is False for t in (inspect_entry, sync_builtins, try_tool))
    entry = registered(alice_api, "hostile_tools:exit_now")
    before = received(worker, "webapp.registry.tasks.try_tool")
    response = try_it(alice_api, entry, {"status": 3})
    assert response.status_code == 200
    assert "exit code 3" in response.json()["error"]
    time.sleep(2)  # a redelivery would show up in the log by now
    assert received(worker, "webapp.registry.tasks.try_tool") == before + 1
    log = worker.log.read_text()
    assert "WorkerLostError" not in log and "exited with 'exitcode" not in log  # the pool process lived on
    assert "exit code 3" in try_it(alice_api, entry, {"status": 3}).json()["error"]  # and takes the next call


def test_try_it_child_sees_no_secret_key_or_database_url(alice_api: Any, team_a: Any, worker: Worker,
                                                         transactional_db: None) -> None:
    entry = registered(alice_api, "hostile_tools:environment")
    result = try_it(alice_api, entry, {}).json()
    assert result["error"] is None, result
    seen = json.loads(result["observation"])
    names = set(seen["env"])
    assert not names & {"SECRET_KEY", "DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND",
                        "AGENTFLY_REDIS_PREFIX", "CHANNEL_LAYER_PREFIX"}
    assert not any(settings.SECRET_KEY in v or "postgres://" in v for v in seen["env"].values())
    assert seen["parent"].startswith("unreadable")  # not through /proc/<worker>/environ either
    assert seen["redis"].startswith("unreachable")  # nor the broker, which needs no password here


def test_a_hanging_tool_times_out_as_an_error(alice_api: Any, team_a: Any, worker: Worker,
                                              transactional_db: None) -> None:
    entry = registered(alice_api, "hostile_tools:hang")
    result = try_it(alice_api, entry, {"seconds": 600}).json()  # the child is killed at its timeout, not at 600 s
    assert f"ran past {settings.AGENTFLY_CHILD_TIMEOUT:g} s" in result["error"]
    assert "AGENTFLY_CHILD_TIMEOUT" in result["error"]


def test_concurrent_try_calls_beyond_the_limit_get_429(alice: Any, alice_api: Any, alice_client: Any,
                                                       team_a: Any) -> None:
    from webapp.registry.tryslots import TooManyTries, _redis, acquire_slot, release_slot, slot_keys

    calculator, _ = builtin_entries()
    assert settings.AGENTFLY_TRY_CONCURRENCY == 2
    # Two calls in flight, as two other web processes would hold them while their workers run.
    held = [acquire_slot(alice.pk, team_a.pk) for _ in range(2)]
    try:
        response = try_it(alice_api, calculator, {"expression": "1+1"})
        assert response.status_code == 429
        assert "AGENTFLY_TRY_CONCURRENCY=2" in response.json()["detail"]
        page = alice_client.post(reverse("registry:try", args=[calculator.pk]), {"arguments": '{"expression": "1"}'})
        assert page.status_code == 429 and "AGENTFLY_TRY_CONCURRENCY" in page.context["result"]["error"]
        with pytest.raises(TooManyTries):
            acquire_slot(alice.pk, team_a.pk)
    finally:
        for slot in held:
            release_slot(slot)
    # Every slot is given back; refused ones were never taken.
    assert all(_redis().zcard(key) == 0 for key in slot_keys(alice.pk, team_a.pk))


def test_reinspecting_a_stored_entry_the_rule_refuses_marks_it_failed(alice_client: Any, team_a: Any) -> None:
    system = ready_entry(team_a, "tool", "os:system", "system")
    response = alice_client.post(reverse("registry:reinspect", args=[system.pk]), follow=True)
    assert response.status_code == 200
    system.refresh_from_db()
    assert system.status == EntryStatus.FAILED and "AGENTFLY_PLUGIN_DIRS" in system.error
    assert "is not registrable code" in response.content.decode()
