"""A gateway job end to end on the tiny model: agents outside the trainer drive its rollouts with the openai SDK
through the job's endpoint, and the trainer steps on their recorded conversations."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from trainer.config import load_config
from trainer.events import CallbackSink
from trainer.loop import Trainer

pytestmark = pytest.mark.slow

REWARD = "rollout.reward=rewards_for_tests:answer_length"


def endpoint(out: Path, timeout: float = 60.0) -> dict[str, str]:
    path = out / "gateway.json"
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, "the job never wrote gateway.json"
        time.sleep(0.05)
    return dict(json.loads(path.read_text()))


def agents(out: Path, stop: threading.Event, seen: list[str]) -> None:
    """The team's agent pool: take a sample, talk to the model for two turns, end the rollout; until stopped."""
    where = endpoint(out)
    http = httpx.Client(base_url=where["url"], headers={"Authorization": f"Bearer {where['job_key']}"})
    while not stop.is_set():
        try:
            response = http.get("/samples", params={"n": 4})
        except httpx.ConnectError:  # the job ended and its gateway with it
            return
        if response.status_code == 429:  # between batches: the job is updating
            time.sleep(float(response.headers["retry-after"]) / 10)
            continue
        if response.status_code == 401:  # the job ended: its key is revoked
            return
        response.raise_for_status()
        for handout in response.json()["data"]:
            client = openai.OpenAI(base_url=where["url"], api_key=handout["api_key"])
            messages = list(handout["messages"])
            for follow_up in ("Are you sure?", None):
                reply = client.chat.completions.create(model="policy", messages=messages, max_tokens=8)
                messages.append(reply.choices[0].message.model_dump(exclude_none=True))
                if follow_up:
                    messages.append({"role": "user", "content": follow_up})
            client.post(f"/rollouts/{handout['rollout_id']}/finish", cast_to=httpx.Response)
            seen.append(handout["rollout_id"])


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_gateway_job_trains_on_the_conversations_of_agents_outside_it(tiny_model_dir, tmp_path, tiny_overrides,
                                                                        mode):
    out = tmp_path / "gateway-job"
    events: list[dict[str, Any]] = []
    config = load_config(None, tiny_overrides(tiny_model_dir, out, REWARD, "gateway.enabled=true",
                                              "optim.lr=0.003", "data.eval_size=2", f"rollout.mode={mode}"))
    stop, seen = threading.Event(), []
    pool = threading.Thread(target=agents, args=(out, stop, seen), daemon=True)
    pool.start()
    try:
        Trainer(config, sinks=[CallbackSink(events.append)]).train()
    finally:
        stop.set()
        pool.join(timeout=30)
    steps = [e["data"] for e in events if e["type"] == "metrics" and "time/rollout" in e["data"]]
    assert len(steps) == 2
    for metrics in steps:
        assert metrics["turns/mean"] == 2.0 and metrics["rollout/infra_failed"] == 0.0
        assert metrics["grad_norm"] > 0 and "reward/mean" in metrics
        assert metrics["gateway/mismatches"] == 0 and metrics["gateway/client_lost"] == 0
        assert metrics["gateway/requests"] >= 2 * 4  # two turns of each of the step's four rollouts so far
        if mode == "async":  # the producer hands out the next batch during the update, within the bound
            assert metrics["rollout/staleness_max"] <= config.rollout.max_staleness
    # 2 steps x 2 prompts x 2 rollouts, plus the final evaluation's 2 held-out problems.
    assert len(seen) == 10
    logs = [e["data"]["message"] for e in events if e["type"] == "log"]
    assert any("gateway serving the policy at http://127.0.0.1:" in m for m in logs)
    assert not (out / "gateway.json").exists()  # the job ended: its keys are revoked and the file is gone


def test_a_gateway_job_no_agent_serves_stops_saying_so_instead_of_waiting_for_ever(tiny_model_dir, tmp_path,
                                                                                   tiny_overrides):
    from trainer.loop import InfrastructureStop

    config = load_config(None, tiny_overrides(tiny_model_dir, tmp_path / "unserved", REWARD, "gateway.enabled=true",
                                              "gateway.take_timeout=1", "rollout.max_infra_failed_steps=2"))
    with pytest.raises(InfrastructureStop, match=r"no_client: no agent took a rollout of this job for 1 s"):
        Trainer(config).train()
