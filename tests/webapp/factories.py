"""Rows the tests need without a worker: registry entries as a worker would have recorded them."""

from __future__ import annotations

from typing import Any

from webapp.registry.models import Entry, EntryStatus, Kind, Version


def ready_entry(team: Any, kind: str, import_path: str, name: str) -> Entry:
    entry = Entry.objects.create(team=team, kind=kind, import_path=import_path, name=name, status=EntryStatus.READY)
    entry.current_version = Version.objects.create(entry=entry, source_hash=f"{name:0<64}"[:64], name=name,
                                                   signature=f"{name}(...)")
    entry.save()
    return entry


def builtin_entries() -> tuple[Entry, Entry]:
    return (ready_entry(None, Kind.TOOL, "agentfly.tools.builtin.calculator:calculator", "calculator"),
            ready_entry(None, Kind.REWARD, "agentfly.rewards.builtin.math:math_equal", "math_equal"))


def launch_data(team_: Any, tool: Entry, reward: Entry, /, **overrides: Any) -> dict[str, Any]:
    """A valid launch form submission: a tiny CPU job of a few steps."""
    data = {
        "name": "tiny calculator", "team": team_.pk, "model_source": "tiny", "model_path": "", "task": "arithmetic",
        "task_path": "", "task_size": 50, "tools": [tool.pk], "reward": reward.pk, "algorithm": "grpo", "steps": 3,
        "prompts_per_step": 2, "group_size": 2, "max_turns": 2, "max_new_tokens": 12, "learning_rate": 1e-4,
        "temperature": 1.0, "seed": 0, "eval_size": 2, "save_every": 1, "resources": "", "queue": "cpu",
        "launch_key": "",
    }
    data.update(overrides)
    return data


def launch_tiny_job(api: Any, builtins: dict[str, Any], **fields: Any) -> int:
    """A tiny calculator job launched through the API (one prompt x 2 rollouts a step, a checkpoint every
    step); ``fields`` override the payload. Returns the job's id."""
    payload = {"name": "tiny", "team": "team-a", "tools": [builtins["calculator"].pk],
               "reward": builtins["math_equal"].pk, "steps": 6, "prompts_per_step": 1, "group_size": 2,
               "max_turns": 1, "max_new_tokens": 4, "eval_size": 1, "save_every": 1, **fields}
    response = api.post("/api/jobs/", payload, format="json")
    assert response.status_code == 201, response.content
    return int(response.json()["id"])
