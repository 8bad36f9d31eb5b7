"""The key-chain example launches from the web app: its tool and reward are built-in registry entries, the
launch form and API offer its task, and the job's config gives the trainer the ``kv`` store's pool."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from tests.webapp.factories import launch_data
from tests.webapp.helpers import ROOT
from webapp.jobs.models import TrainingJob
from webapp.registry.models import Entry

WARM_START = ROOT / "examples" / "key_chain" / "warm_start"


@pytest.fixture
def key_chain_entries(db: None) -> tuple[Entry, Entry]:
    """``lookup`` and ``chain_answer`` as the worker registers them when it starts (``sync_builtins``)."""
    from webapp.registry.tasks import sync_builtins

    sync_builtins()
    builtin = Entry.objects.filter(team__isnull=True).ready()
    return builtin.get(kind="tool", name="lookup"), builtin.get(kind="reward", name="chain_answer")


def key_chain_data(team: Any, lookup: Entry, chain_answer: Entry, **overrides: Any) -> dict[str, Any]:
    return launch_data(team, lookup, chain_answer, name="key chain", model_source="path",
                       model_path=str(WARM_START), task="key_chain", task_size=8, max_turns=6, max_new_tokens=32,
                       **overrides)


def test_the_workers_builtin_sync_registers_lookup_with_its_kv_store_and_chain_answer(
        key_chain_entries: tuple[Entry, Entry]) -> None:
    lookup, chain_answer = key_chain_entries
    assert lookup.import_path == "agentfly.tools.builtin.lookup:lookup"
    assert lookup.current_version.resource == "kv"
    assert chain_answer.import_path == "agentfly.rewards.builtin.chain:chain_answer"


def test_the_launch_form_offers_the_key_chain_task(alice_client: Any, key_chain_entries: tuple[Entry, Entry]) -> None:
    page = alice_client.get(reverse("jobs:launch")).content.decode()
    assert '<option value="key_chain">' in page
    assert "lookup (built-in)" in page and "chain_answer (built-in)" in page


def test_the_form_launches_the_key_chain_job_from_the_shipped_warm_start_and_its_kv_pool_reaches_the_trainer(
        alice_client: Any, team_a: Any, key_chain_entries: tuple[Entry, Entry]) -> None:
    from trainer.builders import build_resources, import_object
    from trainer.config import Config, from_dict

    response = alice_client.post(reverse("jobs:launch"), key_chain_data(
        team_a, *key_chain_entries, resources='{"kv": {"max": 3}}'))
    assert response.status_code == 302, response.context["form"].errors
    config = TrainingJob.objects.get().config
    assert config["data"]["task"] == "key_chain" and config["data"]["train_size"] == 8
    assert config["model"] == {"path": str(WARM_START), "build_tiny": False, "tiny_seed": 0,
                               "gradient_checkpointing": False}
    assert config["rollout"]["tools"] == ["agentfly.tools.builtin.lookup:lookup"]
    assert config["rollout"]["reward"] == "agentfly.rewards.builtin.chain:chain_answer"
    # What the worker's trainer builds from that config: a pool of key-chain stores, sized as asked.
    cfg = from_dict(Config, config)
    engine = build_resources(cfg, [import_object(p, "tool") for p in cfg.rollout.tools])
    assert engine is not None
    spec = engine.specs["kv"]
    assert spec.scope == "rollout" and spec.pool.max == 3


def test_the_api_launches_the_key_chain_task(alice_api: Any, team_a: Any,
                                             key_chain_entries: tuple[Entry, Entry]) -> None:
    lookup, chain_answer = key_chain_entries
    response = alice_api.post("/api/jobs/", {
        "name": "key chain", "team": "team-a", "model_source": "path", "model_path": str(WARM_START),
        "task": "key_chain", "tools": [lookup.pk], "reward": chain_answer.pk, "max_turns": 6}, format="json")
    assert response.status_code == 201, response.content
    job = response.json()
    assert job["config"]["data"]["task"] == "key_chain"
    assert job["tool_versions"] == [lookup.current_version.source_hash]
