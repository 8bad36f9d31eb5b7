"""Alerts: a webhook URL that points into the server's own network is refused unless the operator allows its
host; a real worker on the alerts queue tells a real local HTTP receiver once per failed, finished or stalled
job, retrying a receiver that errs; another team neither sees nor removes a team's alerts."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from tests.webapp.helpers import Worker, wait_for, worker_env
from webapp.alerts.models import AlertDelivery, AlertRule
from webapp.alerts.webhooks import WebhookRefused, check_webhook_url


@pytest.mark.parametrize(("url", "address"), [
    ("http://127.0.0.1:9/hook", "127.0.0.1"), ("http://10.1.2.3/hook", "10.1.2.3"),
    ("http://169.254.169.254/latest/meta-data", "169.254.169.254"), ("http://[::1]/hook", "::1"),
    ("http://192.168.0.10/hook", "192.168.0.10"), ("http://0.0.0.0/hook", "0.0.0.0")])
def test_a_webhook_into_the_servers_own_network_is_refused_naming_the_setting(url: str, address: str) -> None:
    with pytest.raises(WebhookRefused, match=f"internal address \\({address}\\).*AGENTFLY_ALERT_ALLOWED_HOSTS"):
        check_webhook_url(url)


def test_a_public_address_is_accepted_and_an_allowed_host_may_be_local(settings: Any) -> None:
    assert check_webhook_url("https://93.184.216.34/hooks/x?k=1") == ("https", "93.184.216.34", 443, "93.184.216.34")
    settings.AGENTFLY_ALERT_ALLOWED_HOSTS = ["127.0.0.1"]
    assert check_webhook_url("http://127.0.0.1:8000/hook")[3] == "127.0.0.1"
    with pytest.raises(WebhookRefused, match="no user or password"):
        check_webhook_url("https://user:pw@93.184.216.34/")


def test_the_page_refuses_a_private_webhook_and_a_rule_with_nowhere_to_send(alice_client: Any, team_a: Any) -> None:
    private = alice_client.post("/alerts/", {"team": team_a.pk, "on_failed": "on", "stall_minutes": 30,
                                             "webhook_url": "http://10.0.0.5/hook"})
    assert private.status_code == 400 and "AGENTFLY_ALERT_ALLOWED_HOSTS" in private.content.decode()
    nowhere = alice_client.post("/alerts/", {"team": team_a.pk, "on_failed": "on", "stall_minutes": 30})
    assert nowhere.status_code == 400 and "give a webhook URL or an email address" in nowhere.content.decode()
    assert not AlertRule.objects.exists()


def test_another_team_neither_sees_nor_removes_a_teams_alert(alice_client: Any, bob_client: Any, team_a: Any,
                                                             team_b: Any) -> None:
    rule = AlertRule.objects.create(team=team_a, on_failed=True, webhook_url="https://93.184.216.34/alice-secret")
    assert "alice-secret" in alice_client.get("/alerts/").content.decode()
    assert "alice-secret" not in bob_client.get("/alerts/").content.decode()
    assert bob_client.post(f"/alerts/{rule.pk}/remove/").status_code == 404
    assert AlertRule.objects.filter(pk=rule.pk).exists()


class Receiver:
    """A real HTTP server on 127.0.0.1 that records each POST; ``fail_first`` answers 500 that many times."""

    def __init__(self, fail_first: int = 0) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.fail_first = fail_first
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if receiver.fail_first > 0:
                    receiver.fail_first -= 1
                    self.send_response(500)
                else:
                    receiver.bodies.append(body)
                    self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture
def alerts_worker(transactional_db: None, runs_dir: Path, tmp_path: Path) -> Iterator[Worker]:
    """A worker on the alerts queue, allowed to call 127.0.0.1, retrying after 1 s."""
    env = {**worker_env(runs_dir), "AGENTFLY_ALERT_ALLOWED_HOSTS": "127.0.0.1", "AGENTFLY_ALERT_RETRY_S": "1"}
    worker = Worker("alerts", env, tmp_path / "alerts-worker.log")
    try:
        worker.wait_ready()
        yield worker
    finally:
        worker.stop()


@pytest.mark.slow
def test_a_real_receiver_is_told_once_of_a_failed_a_finished_and_a_stalled_job_and_an_erring_one_is_retried(
        alerts_worker: Worker, alice: Any, team_a: Any, settings: Any) -> None:
    from webapp.alerts.actions import do_add_rule
    from webapp.alerts.tasks import scan_for_alerts
    from webapp.jobs.models import TrainingJob

    settings.AGENTFLY_ALERT_ALLOWED_HOSTS = ["127.0.0.1"]
    receiver = Receiver(fail_first=1)
    try:
        do_add_rule(user=alice, team=team_a, on_failed=True, on_stalled=True, on_finished=True, stall_minutes=1,
                    webhook_url=receiver.url, email="")
        now = timezone.now()
        failed = TrainingJob.objects.create(team=team_a, created_by=alice, name="broken", status="failed",
                                            error="reward raised ZeroDivisionError", finished_at=now, config={})
        finished = TrainingJob.objects.create(team=team_a, created_by=alice, name="done", status="succeeded",
                                              step=40, finished_at=now, config={})
        stalled = TrainingJob.objects.create(team=team_a, created_by=alice, name="stuck", status="running",
                                             run_started_at=now - timedelta(minutes=5), config={})
        TrainingJob.objects.create(team=team_a, created_by=alice, name="fresh", status="running",
                                   run_started_at=now, config={})
        for _ in range(2):  # a second scan alerts nothing twice
            scan_for_alerts.apply_async(queue="alerts").get(timeout=30)
        wait_for(lambda: len(receiver.bodies) == 3, 60, "three alerts, one of them after a retry")
    finally:
        receiver.close()
    by_job = {b["job"]["id"]: b for b in receiver.bodies}
    assert set(by_job) == {failed.pk, finished.pk, stalled.pk}
    assert by_job[failed.pk]["event"] == "failed" and "ZeroDivisionError" in by_job[failed.pk]["text"]
    assert by_job[finished.pk]["event"] == "finished" and by_job[stalled.pk]["event"] == "stalled"
    deliveries = list(AlertDelivery.objects.all())
    assert len(deliveries) == 3 and {d.status for d in deliveries} == {"sent"}
    assert sorted(d.attempts for d in deliveries) == [1, 1, 2]
