""""Clone job" and the launch form's presets: a clone launched from the form has the original's config apart
from the fields edited; each shipped example's preset fills a form the trainer accepts, with a held-out
evaluation every few steps (drawn as a curve while the job trains)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from tests.webapp.factories import builtin_entries, launch_data, ready_entry
from webapp.jobs.models import TrainingJob
from webapp.registry.models import Kind


@pytest.fixture
def entries(db: None) -> tuple[Any, Any]:
    return builtin_entries()


def posted(form: Any) -> dict[str, Any]:
    """What a browser posts for an unbound form as shown: each field's initial value (a list for checkboxes)."""
    data: dict[str, Any] = {}
    for name, field in form.fields.items():
        value = form.get_initial_for_field(field, name)
        if value is None:
            continue
        data[name] = [getattr(v, "pk", v) for v in value] if isinstance(value, (list, tuple)) else getattr(value, "pk", value)
    return data


def differences(a: Any, b: Any, path: str = "") -> set[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return {d for k in set(a) | set(b) for d in differences(a.get(k), b.get(k), f"{path}{k}.")}
    return set() if a == b else {path.rstrip(".")}


def test_a_clone_launched_from_the_form_has_the_originals_config_apart_from_the_edited_fields(
        alice_client: Client, team_a: Any, entries: tuple[Any, Any]) -> None:
    alice_client.post(reverse("jobs:launch"), launch_data(team_a, *entries, name="original", steps=4, seed=3,
                                                          temperature=0.7, max_turns=3, resources='{"python": {"max": 2}}'))
    original = TrainingJob.objects.get(name="original")
    page = alice_client.get(reverse("jobs:launch"), {"clone": original.pk})
    assert page.status_code == 200 and "a clone of" in page.content.decode()
    data = posted(page.context["form"]) | {"steps": 9, "learning_rate": 5e-4}
    assert data["name"] == "original (clone)"
    response = alice_client.post(reverse("jobs:launch"), data)
    assert response.status_code == 302, response.content.decode()[:2000]
    clone = TrainingJob.objects.exclude(pk=original.pk).get()
    assert differences(original.config, clone.config) == {"steps", "optim.lr"}
    assert clone.config["steps"] == 9 and clone.config["optim"]["lr"] == 5e-4
    assert list(clone.tool_versions.all()) == list(original.tool_versions.all())
    assert clone.reward_version == original.reward_version and clone.queue == original.queue


def test_the_job_page_links_to_its_clone_and_another_teams_job_cannot_be_cloned(
        alice_client: Client, team_a: Any, bob: Any, entries: tuple[Any, Any]) -> None:
    alice_client.post(reverse("jobs:launch"), launch_data(team_a, *entries, name="mine"))
    job = TrainingJob.objects.get(name="mine")
    assert f"/jobs/launch/?clone={job.pk}" in alice_client.get(job.get_absolute_url()).content.decode()
    bobs = Client()
    bobs.force_login(bob)
    page = bobs.get(reverse("jobs:launch"), {"clone": job.pk}, follow=True)
    assert f"Job #{job.pk} is not one of your teams" in page.content.decode()
    assert page.context["form"]["name"].value() != "mine (clone)"


@pytest.mark.parametrize("preset", ["calculator", "key_chain", "scienceworld"])
def test_each_shipped_examples_preset_fills_a_form_the_trainer_accepts(
        preset: str, alice_client: Client, team_a: Any, entries: tuple[Any, Any]) -> None:
    ready_entry(None, Kind.TOOL, "agentfly.tools.builtin.lookup:lookup", "lookup")
    ready_entry(None, Kind.REWARD, "agentfly.rewards.builtin.chain:chain_answer", "chain_answer")
    ready_entry(None, Kind.TOOL, "agentfly.tools.builtin.scienceworld:sciworld_act", "sciworld_act")
    ready_entry(None, Kind.TOOL, "agentfly.tools.builtin.scienceworld:sciworld_look", "sciworld_look")
    ready_entry(None, Kind.REWARD, "agentfly.rewards.builtin.env:env_score", "env_score")
    page = alice_client.get(reverse("jobs:launch"), {"preset": preset})
    data = posted(page.context["form"]) | {"team": team_a.pk}
    response = alice_client.post(reverse("jobs:launch"), data)
    assert response.status_code == 302, [str(e) for e in response.context["form"].errors.items()]
    job = TrainingJob.objects.get()
    assert not job.config["model"]["build_tiny"] and job.config["model"]["path"].endswith("warm_start")
    assert job.config["eval"]["every"] > 0 and job.config["steps"] >= 10 * job.config["eval"]["every"] / 10
    assert job.config["rollout"]["group_size"] >= 4  # a GRPO group that can tell its rollouts apart


def test_an_unknown_preset_names_the_ones_there_are(alice_client: Client, entries: tuple[Any, Any]) -> None:
    page = alice_client.get(reverse("jobs:launch"), {"preset": "nope"})
    assert "No preset named &#x27;nope&#x27;; pick one of calculator, key_chain, retrieval, scienceworld, smollm2, code_repair" in page.content.decode()


def test_the_default_launch_evaluates_every_ten_steps(alice_client: Client, team_a: Any,
                                                       entries: tuple[Any, Any]) -> None:
    alice_client.post(reverse("jobs:launch"), launch_data(team_a, *entries, eval_every=10, steps=30))
    assert TrainingJob.objects.get().config["eval"]["every"] == 10


def test_the_job_list_filters_by_state_task_and_algorithm_and_sorts_by_a_final_metric(
        alice_client: Client, team_a: Any, alice: Any, entries: tuple[Any, Any]) -> None:
    def make(name: str, status: str, task: str, algorithm: str, accuracy: float | None) -> None:
        TrainingJob.objects.create(team=team_a, created_by=alice, name=name, status=status,
                                   config={"steps": 5, "data": {"task": task}, "algorithm": {"name": algorithm}},
                                   final_metrics={} if accuracy is None else {"eval/accuracy": accuracy})
    make("a", "succeeded", "arithmetic", "grpo", 0.5)
    make("b", "succeeded", "key_chain", "grpo", 0.9)
    make("c", "failed", "key_chain", "rloo", None)
    make("d", "succeeded", "key_chain", "grpo", 0.7)

    def names(**query: str) -> list[str]:
        return [j.name for j in alice_client.get(reverse("jobs:list"), query).context["jobs"]]

    assert names(task="key_chain", algorithm="grpo", sort="-eval/accuracy") == ["b", "d"]
    assert names(status="failed") == ["c"]
    assert names(sort="-eval/accuracy") == ["b", "d", "a", "c"]  # a job without the metric last
    assert names(sort="name") == ["a", "b", "c", "d"]
    page = alice_client.get(reverse("jobs:list"), {"task": "wiki_qa"}).content.decode()
    assert "No job matches these filters." in page


def test_grpo_with_a_group_of_one_is_flagged_along_with_the_other_errors(
        alice_client: Client, team_a: Any, entries: tuple[Any, Any]) -> None:
    response = alice_client.post(reverse("jobs:launch"), launch_data(team_a, *entries, group_size=1, task="jsonl"))
    errors = response.context["form"].errors
    assert "task_path" in errors  # another field's error ...
    assert "needs rollout.group_size >= 2" in errors["group_size"][0]  # ... and the group size's, at once


def test_a_relative_model_path_is_refused_with_the_absolute_form_asked_for(
        alice_client: Client, team_a: Any, entries: tuple[Any, Any]) -> None:
    response = alice_client.post(reverse("jobs:launch"), launch_data(team_a, *entries, model_source="path",
                                                                     model_path="examples/calculator/warm_start"))
    assert "is relative; give the absolute path" in response.context["form"].errors["model_path"][0]
    assert not TrainingJob.objects.exists()


def test_a_relative_path_is_told_relative_with_its_absolute_form_even_where_no_folder_is_allowed(
        alice_client: Client, team_a: Any, entries: tuple[Any, Any], settings: Any) -> None:
    from webapp.jobs.paths import team_dir

    settings.AGENTFLY_ALLOWED_PATHS = []  # resolved against the server's folder, it would be "outside" them
    response = alice_client.post(reverse("jobs:launch"), launch_data(
        team_a, *entries, model_source="path", model_path="models/mine", judge_source="path",
        judge_model_path="./judge"))
    errors = response.context["form"].errors
    for field, path in (("model_path", "models/mine"), ("judge_model_path", "judge")):
        assert "is relative; give the absolute path on the workers' shared disk" in errors[field][0], errors
        assert str(team_dir(team_a) / path) in errors[field][0] and "outside" not in errors[field][0]
    assert not TrainingJob.objects.exists()


def test_the_landing_page_points_a_signed_in_user_at_the_job_already_running(
        alice_client: Client, team_a: Any, alice: Any, entries: tuple[Any, Any]) -> None:
    job = TrainingJob.objects.create(team=team_a, created_by=alice, name="demo: already running", status="running",
                                     config={"steps": 10})
    page = alice_client.get("/").content.decode()
    assert 'id="active-jobs"' in page and f"/monitor/jobs/{job.pk}/" in page and "Or launch another" in page
    assert "to launch the demo job" not in page
    assert "{#" not in page and "{%" not in page  # no template comment leaks into the page


def test_tags_and_notes_on_a_job_are_saved_for_its_team_and_filter_the_list(
        alice_client: Client, team_a: Any, alice: Any, bob: Any, entries: tuple[Any, Any]) -> None:
    tagged = TrainingJob.objects.create(team=team_a, created_by=alice, name="tagged", config={"steps": 5})
    TrainingJob.objects.create(team=team_a, created_by=alice, name="plain", config={"steps": 5})
    alice_client.post(f"/monitor/jobs/{tagged.pk}/notes/", {"tags": "LR Sweep, baseline, lr sweep",
                                                            "notes": "lr 3e-4 diverged after step 40"})
    page = alice_client.get(tagged.get_absolute_url()).content.decode()
    assert 'value="lr sweep, baseline"' in page and "lr 3e-4 diverged after step 40" in page
    assert [j.name for j in alice_client.get(reverse("jobs:list"), {"tag": "Baseline"}).context["jobs"]] == ["tagged"]
    response = alice_client.post(f"/monitor/jobs/{tagged.pk}/notes/", {"tags": "x" * 31}, follow=True)
    assert "longer than 30 characters" in response.content.decode()
    bobs = Client()
    bobs.force_login(bob)
    assert bobs.post(f"/monitor/jobs/{tagged.pk}/notes/", {"tags": "mine"}).status_code == 404
    tagged.refresh_from_db()
    assert tagged.note.tags == ["lr sweep", "baseline"]


def test_the_smollm2_preset_launches_a_warm_start_with_the_habit_then_grpo_on_smollm2s_gguf_file(
        alice_client: Client, team_a: Any, entries: tuple[Any, Any], settings: Any, smollm2_gguf: Any) -> None:
    settings.AGENTFLY_ALLOWED_PATHS = [*settings.AGENTFLY_ALLOWED_PATHS, smollm2_gguf.parent]  # the operator's
    page = alice_client.get(reverse("jobs:launch"), {"preset": "smollm2"})
    data = posted(page.context["form"]) | {"team": team_a.pk}
    response = alice_client.post(reverse("jobs:launch"), data)
    assert response.status_code == 302, [str(e) for e in response.context["form"].errors.items()]
    job = TrainingJob.objects.get()
    assert job.kind == "sft_then_rl"
    assert job.config["model"] | {"tiny_seed": 0} == {"path": str(smollm2_gguf.parent), "gguf_file": smollm2_gguf.name,
                                                       "build_tiny": False, "tiny_seed": 0,
                                                       "gradient_checkpointing": False}
    sft = job.config["sft"]
    assert (sft["habit"], sft["habit_phrasings"], sft["habit_fraction"]) == (
        "no_tool", ["Evaluate", "Find the value of"], 0.7)
    assert job.config["eval"]["every"] == 8 and job.config["max_minutes"] == 30
    # A clone of it opens on the same model source and habit.
    clone = alice_client.get(reverse("jobs:launch"), {"clone": job.pk}).context["form"]
    assert posted(clone)["model_source"] == "smollm2" and posted(clone)["sft_habit"] == "no_tool"
    assert posted(clone)["sft_habit_phrasings"] == "Evaluate, Find the value of"


def test_the_code_repair_preset_launches_smollm2_in_a_forked_workspace_with_its_tools_pool_and_test_reward(
        alice_client: Client, team_a: Any, entries: tuple[Any, Any], settings: Any, smollm2_gguf: Any) -> None:
    settings.AGENTFLY_ALLOWED_PATHS = [*settings.AGENTFLY_ALLOWED_PATHS, smollm2_gguf.parent]
    for name in ("bash", "read_file", "write_file", "run_tests"):
        ready_entry(None, Kind.TOOL, f"agentfly.tools.builtin.workspace:{name}", name)
    ready_entry(None, Kind.REWARD, "agentfly.rewards.builtin.repair:repair_tests", "repair_tests")
    page = alice_client.get(reverse("jobs:launch"), {"preset": "code_repair"})
    data = posted(page.context["form"]) | {"team": team_a.pk}
    response = alice_client.post(reverse("jobs:launch"), data)
    assert response.status_code == 302, [str(e) for e in response.context["form"].errors.items()]
    job = TrainingJob.objects.get()
    assert job.kind == "sft_then_rl" and job.config["data"]["task"] == "code_repair"
    assert sorted(job.config["rollout"]["tools"]) == [f"agentfly.tools.builtin.workspace:{n}" for n in
                                                      ("bash", "read_file", "run_tests", "write_file")]
    assert job.config["rollout"]["reward"] == "agentfly.rewards.builtin.repair:repair_tests"
    assert job.config["resources"] == {"workspace": {"max": 8}} and job.config["sft"]["habit"] == "skip_check"
    assert job.config["micro_batch_tokens"] == 8192  # six-turn rows with whole-file writes: each pass bounded
    assert job.config["model"]["gradient_checkpointing"] is True


def test_smollm2_is_refused_until_the_operator_allows_its_folder(
        alice_client: Client, team_a: Any, entries: tuple[Any, Any], settings: Any, smollm2_gguf: Any) -> None:
    settings.AGENTFLY_ALLOWED_PATHS = []
    response = alice_client.post(reverse("jobs:launch"), launch_data(team_a, *entries, model_source="smollm2"))
    assert response.status_code == 400 and not TrainingJob.objects.exists()
    error = " ".join(response.context["form"].errors["model_source"])
    assert "SmolLM2's folder" in error and "AGENTFLY_ALLOWED_PATHS" in error


def test_a_habit_for_another_task_is_refused_on_its_field(
        alice_client: Client, team_a: Any, entries: tuple[Any, Any]) -> None:
    response = alice_client.post(reverse("jobs:launch"), launch_data(
        team_a, *entries, kind="sft_then_rl", sft_habit="early_answer", sft_habit_phrasings="Evaluate"))
    assert response.status_code == 400 and not TrainingJob.objects.exists()
    assert "sft.habit='early_answer' is not a habit of the arithmetic task's demonstrator" in " ".join(
        response.context["form"].errors["sft_habit"])


@pytest.mark.parametrize(("fields", "field", "says"), [
    ({"sft_habit": "no_tool"}, "sft_habit_phrasings", "The habit no_tool shows on questions that open with"),
    ({"sft_habit_phrasings": "Evaluate"}, "sft_habit", "Habit phrasings are given but no habit"),
])
def test_a_habit_needs_its_phrasings_and_phrasings_need_a_habit(
        fields: dict[str, str], field: str, says: str, alice_client: Client, team_a: Any,
        entries: tuple[Any, Any]) -> None:
    response = alice_client.post(reverse("jobs:launch"), launch_data(team_a, *entries, kind="sft_then_rl", **fields))
    assert response.status_code == 400 and not TrainingJob.objects.exists()
    assert says in " ".join(response.context["form"].errors[field])


def test_smollm2_cannot_be_its_own_judge(
        alice_client: Client, team_a: Any, entries: tuple[Any, Any], settings: Any, smollm2_gguf: Any) -> None:
    settings.AGENTFLY_ALLOWED_PATHS = [smollm2_gguf.parent]
    response = alice_client.post(reverse("jobs:launch"), launch_data(
        team_a, *entries, model_source="smollm2", judge_source="policy"))
    assert response.status_code == 400 and not TrainingJob.objects.exists()
    assert "SmolLM2's GGUF file, which a judge does not load" in " ".join(response.context["form"].errors["judge_source"])
