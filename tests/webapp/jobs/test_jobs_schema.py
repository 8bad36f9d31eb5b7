"""The launch form, the REST API and the page are built from the trainer's config (``webapp.jobs.schema``): every
setting the config exposes is taken by both, within the config's own bounds and choices and refused with the
config's own messages, and comes back unchanged when a job is cloned."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest
from django.core.cache import cache
from django.core.exceptions import ValidationError
from django.urls import reverse

from tests.webapp.factories import builtin_entries, launch_data
from trainer.config import Config, ConfigError, from_dict
from webapp.jobs import schema
from webapp.jobs.forms import initial_from_job
from webapp.jobs.models import TrainingJob


@pytest.fixture
def entries(db: None) -> tuple[Any, Any]:
    return builtin_entries()


def api_payload(entries: tuple[Any, Any], **fields: Any) -> dict[str, Any]:
    tool, reward = entries
    return {"name": "schema", "team": "team-a", "tools": [tool.pk], "reward": reward.pk, **fields}


def launch_by_api(api: Any, payload: dict[str, Any]) -> Any:
    cache.clear()  # the launch throttle (30 an hour) counts in the cache; this test launches more
    return api.post("/api/jobs/", payload, format="json")


# ---------------------------------------------------------------------------------------------- the three drifts
def test_the_api_takes_eval_every_and_the_job_evaluates_on_that_cadence(
        alice_api: Any, team_a: Any, entries: tuple[Any, Any]) -> None:
    response = launch_by_api(alice_api, api_payload(entries, eval_every=3))
    assert response.status_code == 201, response.content
    assert response.json()["config"]["eval"]["every"] == 3


def test_the_form_and_the_api_take_a_staleness_above_16_as_the_config_does(
        alice_client: Any, alice_api: Any, team_a: Any, entries: tuple[Any, Any]) -> None:
    assert from_dict(Config, {"rollout": {"mode": "async", "max_staleness": 32}}).rollout.max_staleness == 32
    response = alice_client.post(reverse("jobs:launch"), launch_data(team_a, *entries, rollout_mode="async",
                                                                     max_staleness=32))
    assert response.status_code == 302, response.context["form"].errors
    assert TrainingJob.objects.get().config["rollout"]["max_staleness"] == 32
    response = launch_by_api(alice_api, api_payload(entries, rollout_mode="async", max_staleness=20))
    assert response.status_code == 201, response.content
    assert response.json()["config"]["rollout"]["max_staleness"] == 20


def test_the_form_offers_every_credit_assignment_of_the_config_and_the_job_gets_the_one_chosen(
        alice_client: Any, team_a: Any, entries: tuple[Any, Any]) -> None:
    page = alice_client.get(reverse("jobs:launch")).content.decode()
    offered = re.findall(r'<option value="([^"]*)"', page.split('name="credit"', 1)[1].split("</select>", 1)[0])
    assert offered == ["outcome", "turn", "step", "turn_gae"]
    response = alice_client.post(reverse("jobs:launch"), launch_data(team_a, *entries, credit="turn"))
    assert response.status_code == 302, response.context["form"].errors
    assert TrainingJob.objects.get().config["algorithm"]["credit"] == "turn"
    # The trainer's rule on the combination lands on the credit field, in the trainer's words.
    response = alice_client.post(reverse("jobs:launch"), launch_data(team_a, *entries, credit="turn_gae"))
    assert "algorithm.credit=turn_gae needs a critic" in response.context["form"].errors["credit"][0]


# ---------------------------------------------------------------------------------------------- every setting
def probes(s: schema.Setting) -> list[Any]:
    """Values at and across each bound of ``s``, each of its choices and one that is none."""
    if s.choices:
        values = [[c] if s.many else c for c in s.choices]
        return [*values, ["nonesuch"] if s.many else "nonesuch"]
    if s.type not in (int, float):
        return []
    step = 1 if s.type is int else 0.5
    values: list[Any] = [s.initial] if s.initial is not None else []
    for bound, value in s.bounds.items():
        values += [value, value - step if bound in ("ge", "gt") else value + step]
    return [s.type(v) for v in values]


def config_says(s: schema.Setting, value: Any) -> str | None:
    """The config's answer to ``value`` for ``s`` (every key the field fills): None, or its message."""
    data: dict[str, Any] = {}
    for key in s.keys:
        schema.put(data, key, value)
    try:
        from_dict(Config, data)
    except ConfigError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("setting", schema.SETTINGS, ids=lambda s: s.name)
def test_the_api_accepts_exactly_what_the_config_accepts_with_the_configs_message(
        alice_api: Any, team_a: Any, entries: tuple[Any, Any], setting: schema.Setting) -> None:
    assert probes(setting) or setting.type in (str, bool), f"{setting.key}: no probe for {setting.type}"
    for value in probes(setting):
        refused = config_says(setting, value)
        response = launch_by_api(alice_api, api_payload(entries, **{setting.name: value}))
        TrainingJob.objects.all().delete()  # no quota of running jobs in the way of the next probe
        if refused is None:
            assert response.status_code == 201, (setting.key, value, response.content)
            continue
        assert response.status_code == 400, (setting.key, value, refused)
        said = response.json().get(setting.name)
        assert said, (setting.key, value, response.json())
        if not setting.many:  # a list's message names the item ("trackers[0]"); the form's names the field
            assert said[0]["message"] == refused, (setting.key, value)


def test_every_setting_is_in_the_form_the_api_and_the_openapi_schema_with_the_configs_bounds(
        alice_client: Any, team_a: Any, entries: tuple[Any, Any]) -> None:
    from drf_spectacular.generators import SchemaGenerator

    from webapp.jobs.forms import LaunchForm
    from webapp.jobs.rest import LaunchSerializer

    api = SchemaGenerator().get_schema(request=None, public=True)["components"]["schemas"]["Launch"]
    page = alice_client.get(reverse("jobs:launch")).content.decode()
    for s in schema.SETTINGS:
        assert s.name in LaunchForm.base_fields and s.name in LaunchSerializer().fields, s.key
        documented = api["properties"][s.name]
        assert documented.get("minimum") == s.bounds.get("ge") and documented.get("maximum") == s.bounds.get("le")
        if s.web.section is not None:
            assert f'data-field="{s.name}"' in page, s.key  # on the page, in its section
    assert not set(api.get("required", [])) & set(schema.BY_NAME)  # every setting may be left out


def other_value(s: schema.Setting) -> Any:
    """A valid value of ``s`` that is not its initial one, derived from its declaration alone."""
    if s.many:
        return [s.choices[0]]
    if s.choices:
        return next(c for c in s.choices if c != s.initial and c is not None)
    if s.type is bool:
        return not s.initial
    if s.type is int:  # an optional one may start empty (None): one above its lower bound then
        return (s.bounds.get("ge", 0) if s.initial is None else s.initial) + 1
    if s.type is float:
        return s.initial / 2 if s.initial else s.bounds.get("ge", s.bounds.get("gt", 0)) + 1
    return f"{s.initial} again"


def test_a_clone_opens_with_every_setting_as_the_job_was_launched(
        alice_client: Any, team_a: Any, entries: tuple[Any, Any]) -> None:
    chosen = {s.name: other_value(s) for s in schema.SETTINGS}
    # A warm start with a habit, so the warm start's settings are stored at all (an rl job has no sft section).
    form = launch_data(team_a, *entries, kind="sft_then_rl", sft_habit="no_tool", sft_habit_phrasings="Evaluate",
                       **chosen)
    response = alice_client.post(reverse("jobs:launch"), form)
    assert response.status_code == 302, response.context["form"].errors
    job = TrainingJob.objects.get()
    for s in schema.SETTINGS:
        for key in s.keys:
            section, _, name = key.rpartition(".")
            stored = job.config.get(section, {}) if section else job.config
            assert stored[name] == chosen[s.name], key
    initial = initial_from_job(job)
    assert {name: initial[name] for name in chosen} == chosen
    page = alice_client.get(reverse("jobs:launch"), {"clone": job.pk})
    assert {name: page.context["form"].initial[name] for name in chosen} == chosen


def test_a_setting_declared_in_a_config_section_alone_gets_its_form_field_api_field_mapping_and_page_rule() -> None:
    from trainer.config import Web, _f

    @dataclasses.dataclass
    class Section:  # as another engineer would add to trainer/config.py, and nothing else
        warmup: int = _f(0, "Warm-up steps.", ge=0, le=50, web=Web("algorithm", initial=3,
                                                                   show_if={"kind": ("!sft",)}))
        unseen: int = _f(1, "Not for the web.")

    [setting] = schema.settings_of(Section, "optim.")
    assert (setting.key, setting.name, setting.initial) == ("optim.warmup", "optim_warmup", 3)
    field = schema.form_field(setting)
    assert field.initial == 3 and field.help_text == "Warm-up steps." and field.show_if == '{"kind": ["!sft"]}'
    assert field.widget.attrs == {"min": 0, "max": 50}
    with pytest.raises(ValidationError, match=r"optim\.warmup=51 must be between 0 and 50"):
        field.clean("51")
    api = schema.serializer_field(setting)
    assert (api.min_value, api.max_value, api.default) == (0, 50, 3)
