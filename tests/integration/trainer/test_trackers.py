"""Experiment trackers on a real two-step run: each tracker's own files read back with its own reader hold the
metrics under the names of events.jsonl (which the dashboard shows), and MLflow holds the params and the final
checkpoint as an artefact."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from trainer.config import load_config
from trainer.events import read_events
from trainer.loop import Trainer


def wandb_history(run_file: Path) -> list[dict[str, Any]]:
    """The history rows of an offline ``run-*.wandb`` file (wandb 0.2x+ ships no Python reader for it).

    The file is W&B's record log (LevelDB's log format): a 7-byte header, then 32 KiB blocks of records, each
    ``crc32 (4) | length (2) | type (1) | data``, a record split over blocks as FIRST/MIDDLE/LAST parts; every
    record is a ``wandb_internal_pb2.Record`` protobuf, parsed with wandb's own schema.
    """
    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    assert data[:4] == b":W&B", "not a W&B run file"
    block, pos, part, rows = 32768, 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # too little room left for a header: the block is padded
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        part += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST: the record is complete
            record = wandb_internal_pb2.Record()
            record.ParseFromString(part)
            part = b""
            if record.WhichOneof("record_type") == "history":
                rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                             for item in record.history.item})
    return rows


@pytest.mark.slow
def test_tensorboard_wandb_and_mlflow_each_hold_the_metrics_under_the_jsonl_names(
    tiny_model_dir: Path, tmp_path: Path, tiny_overrides: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing import event_accumulator

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "run"
    store = (tmp_path / "mlruns").as_uri()
    config = load_config(None, tiny_overrides(
        tiny_model_dir, out, "rollout.reward=rewards_for_tests:answer_length", "trackers=[tensorboard, wandb, mlflow]",
        "tracker_options.wandb.project=trackers-test", f"tracker_options.mlflow.tracking_uri={store}",
        "tracker_options.mlflow.experiment=trackers-test"))
    result = Trainer(config).train()
    assert result["state"] == "succeeded"

    metrics = read_events(out / "events.jsonl", "metrics")
    names = {k for e in metrics for k, v in e["data"].items() if v is not None}
    rewards = {e["step"]: e["data"]["reward/mean"] for e in metrics if "reward/mean" in e["data"]}
    assert {"reward/mean", "loss/policy", "time/rollout", "eval/accuracy"} <= names and sorted(rewards) == [1, 2]

    # TensorBoard, read with TensorBoard's own reader.
    acc = event_accumulator.EventAccumulator(str(out / "tensorboard"), size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    assert set(acc.Tags()["scalars"]) == names
    assert {s.step: s.value for s in acc.Scalars("reward/mean")} == pytest.approx(rewards)

    # Weights & Biases, offline: the run file under <output_dir>/wandb/offline-run-*/.
    (run_file,) = out.glob("wandb/offline-run-*/run-*.wandb")
    rows = wandb_history(run_file)
    assert {k for row in rows for k in row if not k.startswith("_")} == names
    assert {row["_step"]: row["reward/mean"] for row in rows if "reward/mean" in row} == pytest.approx(rewards)

    # MLflow, through its client on the file store: metrics, params, the final checkpoint as an artefact.
    client = MlflowClient(tracking_uri=store)
    (run,) = client.search_runs([client.get_experiment_by_name("trackers-test").experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    assert set(run.data.metrics) == names
    history = client.get_metric_history(run.info.run_id, "reward/mean")
    assert {m.step: m.value for m in history} == pytest.approx(rewards)
    assert run.data.params["algorithm.name"] == "grpo" and run.data.params["rollout.group_size"] == "2"
    artefacts = {Path(f.path).name for f in client.list_artifacts(run.info.run_id, "checkpoint")}
    assert {"model.safetensors", "config.yaml"} <= artefacts
    assert run.data.tags["checkpoint"] == result["checkpoint"]


def test_no_tracker_package_is_imported_until_a_run_names_it() -> None:
    code = ("import sys, trainer, trainer.loop, trainer.trackers, trainer.sft\n"
            "from trainer.config import load_config\n"
            "from trainer.trackers import tracker_sinks\n"
            "assert tracker_sinks(load_config(None, []), __import__('pathlib').Path('.')) == []\n"
            "print(sorted(m for m in ('wandb', 'mlflow', 'tensorboard') if m in sys.modules))")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parents[3]))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# A W&B run's whole life in a fresh interpreter, then what a test's (or a worker's) cleanup does: every process
# still running under this one is killed. W&B's service process must be gone by then, stopped by the sink's close;
# else its atexit hook meets a dead service and can print "ConnectionResetError: Connection lost". (The kill does
# not reliably bring the traceback out, so the service left behind is what the test tells apart.)
WANDB_LIFECYCLE = """
import pathlib, sys, psutil
from trainer.config import WandbOptions
from trainer.events import metrics_event, status_event
from trainer.trackers import WandbSink
sink = WandbSink(WandbOptions(project="exit-test", mode="offline"), pathlib.Path(sys.argv[1]), {"seed": 0})
sink.emit(metrics_event(1, {"reward/mean": 0.5}, at=0.0))
sink.emit(status_event(1, "succeeded", at=0.0))
sink.close()
left = psutil.Process().children(recursive=True)
print("children left after close:", len(left))
for child in left:
    child.kill()
"""


@pytest.mark.slow
def test_a_closed_wandb_sink_leaves_no_service_behind_and_no_traceback_at_exit(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parents[3]), WANDB_MODE="offline", WANDB_SILENT="true")
    done = subprocess.run([sys.executable, "-c", WANDB_LIFECYCLE, str(tmp_path / "run")], capture_output=True,
                          text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert "children left after close: 0" in done.stdout
    assert "Traceback" not in done.stderr and "Connection lost" not in done.stderr, done.stderr
    assert list((tmp_path / "run").glob("wandb/offline-run-*/run-*.wandb"))  # the run was written, then stopped
