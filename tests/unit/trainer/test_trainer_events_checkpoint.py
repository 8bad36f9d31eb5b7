"""The event stream (sinks, envelope, failure isolation) and checkpoint rotation."""

from __future__ import annotations

import json
import math

import pytest
import torch

from trainer.checkpoint import load_state, resolve, save_checkpoint
from trainer.events import CallbackSink, EventStream, JSONLSink, jsonable, read_events

torch.set_num_threads(1)


def test_every_event_reaches_every_sink_with_type_step_time_and_data(tmp_path):
    got: list[dict] = []
    stream = EventStream([JSONLSink(tmp_path / "e.jsonl"), CallbackSink(got.append)], run="r1")
    stream.metrics(3, {"reward/mean": 0.5, "nan": float("nan"), "t": torch.tensor(2.0)})
    stream.status(3, "running")
    stream.close()
    assert [e["type"] for e in got] == ["metrics", "status"]
    event = got[0]
    assert event["step"] == 3 and event["run"] == "r1" and isinstance(event["time"], float)
    assert event["data"] == {"reward/mean": 0.5, "nan": None, "t": 2.0}
    assert read_events(tmp_path / "e.jsonl", "metrics")[0]["data"]["reward/mean"] == 0.5
    json.dumps(got)  # every event is JSON


def test_jsonable_makes_numbers_of_one_element_tensors_and_keeps_nul_unless_told(tmp_path):
    import numpy as np

    value = {1: (torch.tensor([2.5]), np.float32(0.5), float("inf")), "text": "a\x00b", "big": torch.ones(2)}
    out = jsonable(value)
    assert out["1"] == [2.5, 0.5, None] and out["text"] == "a\x00b"
    assert out["big"] is value["big"]  # not one number: left as it is
    assert jsonable(value, nul="\ufffd")["text"] == "a\ufffdb"


def test_a_failing_sink_is_disabled_and_the_others_keep_receiving(tmp_path, capsys):
    got: list[dict] = []

    def broken(event: dict) -> None:
        raise RuntimeError("dashboard down")

    stream = EventStream([CallbackSink(broken), CallbackSink(got.append)])
    stream.log(0, "a")
    stream.log(1, "b")
    assert len(got) == 2
    assert "dashboard down" in capsys.readouterr().err


def test_an_object_without_emit_is_rejected():
    with pytest.raises(TypeError, match="emit"):
        EventStream([object()])  # type: ignore[list-item]


def test_unknown_event_types_are_rejected():
    with pytest.raises(ValueError, match="unknown event type"):
        EventStream([]).emit("metric", 0, {})


class _Model(torch.nn.Module):
    """Stands in for a PreTrainedModel: what save_checkpoint needs is save_pretrained."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Linear(2, 2)

    def save_pretrained(self, path, safe_serialization=True):
        from safetensors.torch import save_file

        save_file(self.state_dict(), str(path / "model.safetensors"))


def test_checkpoints_keep_the_last_n_plus_the_best_and_point_latest(tmp_path):
    model = _Model()
    scores = {1: 0.5, 2: 0.9, 3: 0.4, 4: 0.6}
    for step, score in scores.items():
        save_checkpoint(tmp_path, step, model=model, tokenizer=None, state={"data": {"position": step}},
                        score=score, keep_last=2)
    kept = sorted(p.name for p in tmp_path.glob("checkpoint-0*"))
    assert kept == ["checkpoint-000002", "checkpoint-000003", "checkpoint-000004"]
    assert resolve(tmp_path).name == "checkpoint-000004"
    assert (tmp_path / "checkpoint-best").resolve().name == "checkpoint-000002"
    state = load_state(tmp_path / "checkpoint-latest")
    assert state["step"] == 4 and state["data"] == {"position": 4} and math.isclose(state["score"], 0.6)
    assert {"python", "numpy", "torch"} <= set(state["rng"])


def test_resolving_something_that_is_not_a_checkpoint_says_what_to_pass(tmp_path):
    with pytest.raises(FileNotFoundError, match="checkpoint-latest"):
        resolve(tmp_path)


def test_a_status_outside_the_shared_run_vocabulary_is_rejected():
    from trainer.events import RUN_STATES

    assert RUN_STATES == ("queued", "running", "succeeded", "failed", "cancelled")
    with pytest.raises(ValueError, match="unknown run state 'finished'"):
        EventStream([]).status(1, "finished")  # type: ignore[arg-type]


def test_a_checkpoint_event_names_its_path_step_and_score(tmp_path):
    got: list[dict] = []
    EventStream([CallbackSink(got.append)]).checkpoint(6, tmp_path / "checkpoint-000006", 0.75)
    assert got[0]["type"] == "checkpoint" and got[0]["step"] == 6
    assert got[0]["data"] == {"path": str(tmp_path / "checkpoint-000006"), "step": 6, "score": 0.75}


def test_every_event_type_has_one_constructor_whose_payload_is_its_typed_dict() -> None:
    from trainer.events import (
        EVENT_TYPES,
        checkpoint_event,
        log_event,
        make_event,
        metrics_event,
        resources_event,
        samples_event,
        status_event,
    )

    host = {"host": "h", "pid": 1, "cpu_count": 1, "cpu_percent": 0.0, "process_cpu_percent": 0.0,
            "process_rss_mb": 1.0, "threads": 1, "memory_used_mb": 1.0, "memory_total_mb": 2.0,
            "memory_percent": 50.0, "gpus": [], "gpu_absent": "none here"}
    made = [metrics_event(3, {"loss": math.nan}, run="r", at=5.0), samples_event(3, [{"reward": 1.0}], at=5.0),
            resources_event(3, {"sequences": 4.0}, None, host=host, at=5.0),  # type: ignore[arg-type]
            status_event(3, "preempted", "queued again", level="info", at=5.0),
            checkpoint_event(3, "/runs/checkpoint-000003", at=5.0),
            log_event(3, "failed", "error", traceback="Traceback ...", at=5.0)]
    assert [e["type"] for e in made] == list(EVENT_TYPES)
    assert all(set(e) == {"type", "step", "time", "run", "data"} and e["step"] == 3 and e["time"] == 5.0 for e in made)
    assert made[0]["data"] == {"loss": None} and made[0]["run"] == "r"  # jsonable: NaN is a gap
    assert made[1]["data"] == {"trajectories": [{"reward": 1.0}]}
    assert made[2]["data"] == {"host": host, "engine": {"sequences": 4.0}, "pools": {}}
    assert made[3]["data"] == {"state": "preempted", "message": "queued again", "level": "info"}
    assert made[4]["data"] == {"path": "/runs/checkpoint-000003", "step": 3, "score": None}
    assert made[5]["data"] == {"message": "failed", "level": "error", "traceback": "Traceback ..."}
    with pytest.raises(ValueError, match="unknown run state 'finished'"):
        status_event(1, "finished")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown event type 'gossip'"):
        make_event("gossip", 1, {})  # type: ignore[arg-type]
