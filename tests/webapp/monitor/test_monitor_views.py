"""Dashboard and compare pages, and the JSON history endpoint: who may see what, and bad input."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from trainer.events import checkpoint_event, log_event, metrics_event, samples_event, status_event
from webapp.monitor.events import append_events

pytestmark = pytest.mark.django_db


def signed_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_dashboard_of_a_job_renders_its_socket_path_and_controls(alice: Any, alice_job: Any) -> None:
    response = signed_in(alice).get(f"/monitor/jobs/{alice_job.pk}/")
    assert response.status_code == 200
    html = response.content.decode()
    assert f'"ws_path": "/ws/jobs/{alice_job.pk}/"' in html
    assert f"/jobs/{alice_job.pk}/cancel/" in html
    assert 'id="cancel-button"' in html and 'id="smooth-toggle"' in html and 'id="log-toggle"' in html
    assert "monitor/dashboard.js" in html and "vendor/plotly.min.js" in html


def test_the_dashboard_of_another_teams_job_is_a_404(bob: Any, alice_job: Any) -> None:
    assert signed_in(bob).get(f"/monitor/jobs/{alice_job.pk}/").status_code == 404


def test_an_anonymous_visitor_is_sent_to_sign_in(alice_job: Any) -> None:
    response = Client().get(f"/monitor/jobs/{alice_job.pk}/")
    assert response.status_code == 302 and "/login/" in response["Location"]


def test_events_json_pages_through_the_stored_events_by_sequence_number(alice: Any, alice_job: Any) -> None:
    append_events(alice_job.pk, [metrics_event(s, {"reward_mean": s / 4}) for s in range(1, 6)])
    append_events(alice_job.pk, [log_event(0, "hello")])
    client = signed_in(alice)
    first = client.get(f"/monitor/jobs/{alice_job.pk}/events.json?after=0&limit=4").json()
    assert [e["seq"] for e in first["events"]] == [1, 2, 3, 4]
    assert first["more"] is True and first["last_seq"] == 4
    rest = client.get(f"/monitor/jobs/{alice_job.pk}/events.json?after=4&limit=4").json()
    assert [e["seq"] for e in rest["events"]] == [5, 6]
    assert rest["more"] is False
    only_metrics = client.get(f"/monitor/jobs/{alice_job.pk}/events.json?types=metrics").json()
    assert [e["data"]["reward_mean"] for e in only_metrics["events"]] == [0.25, 0.5, 0.75, 1.0, 1.25]


@pytest.mark.parametrize(("query", "message"), [
    ("after=-1", "after='-1' is not a sequence number"),
    ("after=abc", "after='abc' is not a sequence number"),
    ("limit=0", "limit='0' must be an integer from 1 to 5000"),
    ("limit=999999", "must be an integer from 1 to 5000"),
    ("types=metrics,bogus", "unknown event types ['bogus']"),
])
def test_events_json_refuses_bad_parameters_with_a_message_naming_them(alice: Any, alice_job: Any, query: str,
                                                                      message: str) -> None:
    response = signed_in(alice).get(f"/monitor/jobs/{alice_job.pk}/events.json?{query}")
    assert response.status_code == 400
    assert message in response.json()["error"]


def test_events_json_of_another_teams_job_is_a_404(bob: Any, alice_job: Any) -> None:
    append_events(alice_job.pk, [metrics_event(1, {"reward_mean": 1.0})])
    assert signed_in(bob).get(f"/monitor/jobs/{alice_job.pk}/events.json").status_code == 404


def test_the_compare_page_overlays_only_the_users_own_jobs(alice: Any, bob: Any, alice_job: Any) -> None:
    from webapp.accounts.models import Team
    from webapp.jobs.models import TrainingJob

    second = TrainingJob.objects.create(team=alice_job.team, created_by=alice, name="second run", config={})
    bobs = TrainingJob.objects.create(team=Team.objects.of(bob).get(), created_by=bob, name="bob's", config={})
    response = signed_in(alice).get(f"/monitor/compare/?jobs={alice_job.pk},{second.pk}&jobs={bobs.pk}")
    assert response.status_code == 200
    config = response.context["monitor_config"]
    assert [j["id"] for j in config["jobs"]] == [alice_job.pk, second.pk]
    html = response.content.decode()
    assert f"Not among your teams&#x27; jobs: #{bobs.pk}" in html
    assert "bob&#x27;s" not in html


def test_the_compare_page_explains_a_malformed_job_list(alice: Any, alice_job: Any) -> None:
    response = signed_in(alice).get("/monitor/compare/?jobs=3,x7")
    assert response.status_code == 200
    assert "&#x27;x7&#x27; is not a job id" in response.content.decode()
    assert response.context["monitor_config"]["jobs"] == []


@pytest.mark.parametrize("query", ["types=checkpoint,status", "types=checkpoint&types=status",
                                   "type=checkpoint&type=status"])
def test_both_event_endpoints_filter_by_types_and_read_the_deprecated_type_alias(
        alice: Any, alice_api: Any, alice_job: Any, query: str) -> None:
    append_events(alice_job.pk, [metrics_event(1, {"reward/mean": 0.5}),
                                 checkpoint_event(1, "/runs/x/checkpoint-000001"),
                                 status_event(1, "succeeded")])
    page = signed_in(alice).get(f"/monitor/jobs/{alice_job.pk}/events.json?{query}").json()["events"]
    api = alice_api.get(f"/api/jobs/{alice_job.pk}/events/?{query}").json()["events"]
    assert [e["type"] for e in page] == [e["type"] for e in api] == ["checkpoint", "status"]


def test_the_compare_page_shows_the_settings_that_differ_and_the_final_metrics(alice: Any) -> None:
    from webapp.accounts.models import Team
    from webapp.jobs.models import TrainingJob

    team = Team.objects.of(alice).get()
    made = [TrainingJob.objects.create(team=team, created_by=alice, name=f"seed {seed}", status="succeeded",
                                       config={"seed": seed, "optim": {"lr": 1e-4}, "steps": 5},
                                       final_metrics={"eval/accuracy": acc})
            for seed, acc in ((0, 0.5), (1, 0.7))]
    html = signed_in(alice).get(f"/monitor/compare/?jobs={made[0].pk},{made[1].pk}").content.decode()
    assert 'id="config-diff"' in html and '<td class="mono">seed</td>' in html and "optim.lr</td>" not in html
    assert 'id="seed-groups"' in html and "0.6000 ± 0.1414" in html


def test_the_rollout_viewer_filters_infrastructure_failures_and_gets_them_and_turn_rewards_as_stored(
        alice: Any, alice_job: Any) -> None:
    from agentfly.rollout import Trajectory, Turn, TurnReward

    ended = Trajectory(sample={"question": "k1?"}, rollout_id="r0", group_id="g0",
                       turns=[Turn(0, 0, 3, "<b>look up k1</b>", "stop")], turn_rewards=[TurnReward(0, 0.25, "found k1")],
                       finish_reason="error", failure="killed",
                       failure_reason="<script>alert(1)</script> the host killed the sandbox")
    (stored,) = append_events(alice_job.pk, [samples_event(1, [ended.to_dict()])])
    client = signed_in(alice)
    html = client.get(f"/monitor/jobs/{alice_job.pk}/").content.decode()
    assert 'id="sample-infra"' in html and "only infrastructure failures" in html
    assert "monitor/dashboard.js" in html  # which draws the badge, the reason and each turn's reward from these
    (served,) = client.get(f"/monitor/jobs/{alice_job.pk}/events/{stored.seq}.json").json()["data"]["trajectories"]
    assert (served["failure"], served["failure_reason"]) == ("killed", ended.failure_reason)
    assert served["turn_rewards"] == [{"turn": 0, "value": 0.25, "reason": "found k1"}]
    assert Trajectory.from_dict(served).rewards_per_turn() == [0.25]
