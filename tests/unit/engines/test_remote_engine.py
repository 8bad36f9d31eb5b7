"""``engine: remote`` without servers: the config names what is missing, and an engine whose servers do not
answer fails at once as an infrastructure failure (``server_down``) instead of waiting for ever. The engine on
real servers is tested in ``tests/integration/engines/test_remote.py``."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from agentfly.engines.remote import RemoteEngine
from agentfly.resources.spec import InfrastructureFailure
from trainer.config import ConfigError, load_config


def test_engine_remote_needs_servers_or_replicas_and_urls_and_refuses_them_on_another_engine() -> None:
    with pytest.raises(ConfigError, match=r"engine_servers=.*or engine_replicas=N"):
        load_config(None, ["engine=remote"])
    with pytest.raises(ConfigError, match="not both"):
        load_config(None, ["engine=remote", "engine_replicas=1", "engine_servers=[http://a:1]"])
    with pytest.raises(ConfigError, match="base URLs such as http://gpu1:8000"):
        load_config(None, ["engine=remote", "engine_servers=[gpu1:8000]"])
    with pytest.raises(ConfigError, match="set engine=remote"):
        load_config(None, ["engine_replicas=2"])
    config = load_config(None, ["engine=remote", "engine_servers=[http://gpu1:8000, http://gpu2:8000]"])
    assert config.engine_servers == ["http://gpu1:8000", "http://gpu2:8000"]


def test_an_engine_whose_servers_never_answer_fails_as_server_down_within_its_start_timeout(
    tiny_model_dir: Path
) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(InfrastructureFailure, match="no server answered /v1/models within 1 s") as caught:
        RemoteEngine([f"http://127.0.0.1:{port}"], tiny_model_dir, start_timeout=1.0)
    assert caught.value.kind == "server_down"  # given up at its start timeout, as the message says
    with pytest.raises(ValueError, match="base URL"):
        RemoteEngine(["gpu1:8000"], tiny_model_dir)
