"""The trainer's side of a gateway job: which agent its stages get, and the endpoint file's life."""

from __future__ import annotations

import json
import os
import stat

from agentfly.engines import ReplayEngine
from trainer.builders import build_agent
from trainer.config import Config, from_dict
from trainer.gateway import GatewayAgent


def test_a_gateway_job_rolls_out_through_one_shared_gateway_while_sft_and_eval_run_in_process(tiny, tmp_path):
    _, tokenizer = tiny
    config = from_dict(Config, {"output_dir": str(tmp_path / "job"), "gateway": {"enabled": True}})
    engine = ReplayEngine(tokenizer, lambda _: "Done.")
    trainer_agent, producer_agent = build_agent(config, engine), build_agent(config, engine)
    assert isinstance(trainer_agent, GatewayAgent) and trainer_agent.server is producer_agent.server
    endpoint = tmp_path / "job" / "gateway.json"
    assert json.loads(endpoint.read_text()) == {"url": trainer_agent.url, "job_key": trainer_agent.gateway.job_key}
    assert stat.S_IMODE(os.stat(endpoint).st_mode) == 0o600  # the job key is a secret
    assert not isinstance(build_agent(config, engine, in_process=True), GatewayAgent)
    trainer_agent.close()
    assert endpoint.exists() and trainer_agent.gateway.job_key  # the producer still serves
    producer_agent.close()
    assert not endpoint.exists() and producer_agent.gateway.job_key == ""  # revoked with the last agent
