"""An MCP server named in a config (``mcp.<name>``) gives the agent its tools, and its sessions are the pool of
that name: the key-chain warm start trains against the real key-value server over stdio, each rollout's
session seeded with its own sample's chain by the server's ``seed`` tool."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

import agentfly as af
from trainer.builders import build_resources, mcp_tools
from trainer.config import ConfigError, load_config
from trainer.events import CallbackSink
from trainer.loop import Trainer

pytest.importorskip("mcp")

ROOT = Path(__file__).parents[3]
WARM_START = ROOT / "examples/key_chain/warm_start"
STORE = str(Path(af.__file__).parent / "resources" / "mcp_servers" / "kv_store.py")
SERVER = {"command": [sys.executable, STORE], "tools": ["lookup"], "reset_tool": "reset", "seed_tool": "seed"}


def test_a_configs_mcp_server_gives_its_named_tools_and_a_pool_sized_by_resources() -> None:
    config = load_config(base={"mcp": {"store": SERVER}, "resources": {"store": {"max": 3}},
                               "rollout": {"tools": [], "reward": "agentfly.rewards.builtin.qa:exact_match"}})
    tools = mcp_tools(config)
    assert [t.name for t in tools] == ["lookup"] and tools[0].resource == "store"
    engine = build_resources(config, tools)
    assert engine is not None and engine.pools["store"].spec.pool.max == 3


@pytest.mark.parametrize(("server", "key"), [({}, "mcp.store"), ({"command": []}, "mcp.store.command"),
                                             ({"command": ["x"], "url": "http://h/mcp"}, "mcp.store")])
def test_an_mcp_server_without_exactly_one_transport_is_refused_naming_its_key(server: dict[str, Any],
                                                                               key: str) -> None:
    with pytest.raises(ConfigError) as refused:
        load_config(base={"mcp": {"store": server}})
    assert refused.value.key == key


def test_a_tool_the_server_does_not_list_fails_naming_what_it_lists() -> None:
    config = load_config(base={"mcp": {"store": {**SERVER, "tools": ["teleport"]}}})
    with pytest.raises(ValueError, match=r"no tool \['teleport'\].*'lookup'"):
        mcp_tools(config)


@pytest.mark.timeout(300)
def test_the_key_chain_warm_start_trains_a_step_against_a_seeded_mcp_store(tmp_path: Path) -> None:
    events: list[dict[str, Any]] = []
    config = load_config(ROOT / "examples/key_chain/grpo.yaml", [
        f"model.path={WARM_START}", f"output_dir={tmp_path}", "seed=0", "steps=1", "max_minutes=null", "threads=1",
        "update_threads=1", "progress=false", "data.train_size=4", "rollout.prompts_per_step=2",
        "rollout.group_size=2", "data.eval_size=2", "eval.every=0", "save_every=0", "log_samples=-1",
        "rollout.tools=[]", "rollout.reward=agentfly.rewards.builtin.qa:exact_match"],
        base={"mcp": {"store": SERVER}, "resources": {"store": {"max": 4}}})
    Trainer(config, sinks=[CallbackSink(events.append)]).train()
    pools = [e["data"]["pools"]["store"] for e in events if e["type"] == "resources" and "store" in e["data"]["pools"]]
    assert pools and max(p["created"] for p in pools) >= 1
    observations = [m["content"] for e in events if e["type"] == "samples" for t in e["data"]["trajectories"]
                    for m in t["messages"] if m["role"] == "tool"]
    # The walk started from each rollout's own seeded chain: never "nothing seeded in this session".
    assert any(o.startswith("next: ") for o in observations), observations[:5]
    assert not any("nothing seeded" in o for o in observations)
