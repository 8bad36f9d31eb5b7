"""Experiment trackers as event sinks: TensorBoard, Weights & Biases and MLflow.

Each is optional and imported only when a run names it in ``trackers``; each gets the ``metrics`` events under
the names they have in ``events.jsonl`` and on the web app's dashboard ("reward/mean", "loss/policy",
"time/rollout", ...), at the event's ``step``. W&B and MLflow also get the run's configuration (W&B as its
config, MLflow as dotted params), the checkpoint paths, and the final state; MLflow stores the final
checkpoint as an artefact.

    trackers: [tensorboard, wandb, mlflow]
    tracker_options: {wandb: {project: calculator, mode: offline}, mlflow: {tracking_uri: "file:runs/mlruns"}}

Each library reads its usual environment too (``WANDB_API_KEY``, ``WANDB_MODE``, ``MLFLOW_TRACKING_URI``).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

from trainer.config import TRACKERS, Config, MLflowOptions, WandbOptions, to_dict
from trainer.events import FINAL_STATES, Event, Sink, TensorBoardSink

PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}
MLFLOW_END = {"succeeded": "FINISHED", "failed": "FAILED", "cancelled": "KILLED"}  # RunState -> RunStatus


def _require(tracker: str) -> None:
    if importlib.util.find_spec(PACKAGES[tracker]) is None:
        raise RuntimeError(f"trackers: [{tracker}] needs the {PACKAGES[tracker]} package on this machine: "
                           f"pip install 'agentfly[trackers]' (or take {tracker} out of trackers)")


def _numbers(data: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of a metrics payload (NaN arrives as None: trackers would plot it as a gap anyway)."""
    return {k: float(v) for k, v in data.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def flat_params(data: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """``{"algorithm": {"name": "grpo"}}`` -> ``{"algorithm.name": "grpo"}`` (MLflow params are flat strings)."""
    out: dict[str, str] = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            out |= flat_params(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = str(value)
    return out


class WandbSink:
    """Metrics as W&B history rows; the config as the run's config; checkpoints and the state in its summary."""

    def __init__(self, options: WandbOptions, out: Path, config: dict[str, Any]) -> None:
        import wandb

        directory = Path(options.dir or out)
        directory.mkdir(parents=True, exist_ok=True)
        # console="off": W&B would otherwise wrap this process's stdout and stderr (a Celery worker's logs);
        # reinit="create_new": a worker that runs several jobs in one process gets one run per job.
        self.run = wandb.init(project=options.project, entity=options.entity, name=options.name or out.name,
                              group=options.group, tags=list(options.tags) or None, mode=options.mode,
                              dir=os.fspath(directory), config=config, reinit="create_new",
                              settings=wandb.Settings(console="off"))
        self._exit_code = 0

    def emit(self, event: Event) -> None:
        if event["type"] == "metrics":
            values = _numbers(event["data"])
            if values:
                self.run.log(values, step=event["step"])
        elif event["type"] == "checkpoint":
            self.run.summary["checkpoint"] = event["data"]["path"]
        elif event["type"] == "status" and event["data"]["state"] in FINAL_STATES:
            self.run.summary["state"] = event["data"]["state"]
            self._exit_code = 0 if event["data"]["state"] != "failed" else 1

    def close(self) -> None:
        import wandb

        try:
            self.run.finish(exit_code=self._exit_code)
        finally:
            # W&B keeps its service process (wandb-core) for the life of this one and stops it from an atexit
            # hook; if the service is gone by then (reaped with the rest of a test's or a worker's children),
            # the hook prints "ConnectionResetError: Connection lost" as the interpreter exits. So it is stopped
            # here, while it is known to be alive, once no other run of this process still uses it.
            if wandb.setup().most_recent_active_run is None:
                wandb.teardown()


class MLflowSink:
    """Metrics and params through ``MlflowClient`` (no global active run, so jobs in one worker never mix);
    the final checkpoint as the artefact ``checkpoint/``; the run ends FINISHED, FAILED or KILLED."""

    def __init__(self, options: MLflowOptions, out: Path, config: dict[str, Any]) -> None:
        uri = options.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or (out.resolve() / "mlruns").as_uri()
        if uri.startswith("file:") or "://" not in uri:
            # MLflow 3 refuses its file store unless asked: a file store is what a run folder wants, and it
            # needs no database (mlflow-skinny has none).
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=uri)
        self.tracking_uri = uri
        experiment = self.client.get_experiment_by_name(options.experiment)
        experiment_id = (experiment.experiment_id if experiment is not None
                         else self.client.create_experiment(options.experiment))
        self.run_id: str = self.client.create_run(experiment_id, run_name=options.run_name or out.name).info.run_id
        params = [Param(k, v[:6000]) for k, v in flat_params(config).items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=params[i:i + 100])
        self.log_checkpoint = options.log_checkpoint
        self._checkpoint: str | None = None
        self._ended = False

    def emit(self, event: Event) -> None:
        from mlflow.entities import Metric

        if event["type"] == "metrics":
            stamp = int(event["time"] * 1000)
            metrics = [Metric(k, v, stamp, event["step"]) for k, v in _numbers(event["data"]).items()]
            for i in range(0, len(metrics), 1000):
                self.client.log_batch(self.run_id, metrics=metrics[i:i + 1000])
        elif event["type"] == "checkpoint":
            self._checkpoint = event["data"]["path"]
            self.client.set_tag(self.run_id, "checkpoint", self._checkpoint)
        elif event["type"] == "status" and event["data"]["state"] in FINAL_STATES:
            # The trainer saves its final checkpoint before the final status, so this is the last one.
            if self.log_checkpoint and self._checkpoint and Path(self._checkpoint).is_dir():
                self.client.log_artifacts(self.run_id, self._checkpoint, "checkpoint")
            self.client.set_terminated(self.run_id, MLFLOW_END[event["data"]["state"]])
            self._ended = True

    def close(self) -> None:
        if not self._ended:  # closed without a final status (an interrupted run)
            self.client.set_terminated(self.run_id, "KILLED")


def tracker_sinks(config: Config, out: Path) -> list[Sink]:
    """One sink per tracker the config names, each imported only here, when it is named."""
    sinks: list[Sink] = []
    options = config.tracker_options
    for name in config.resolved_trackers:
        _require(name)
        if name == "tensorboard":
            sinks.append(TensorBoardSink(options.tensorboard.logdir or out / "tensorboard"))
        elif name == "wandb":
            sinks.append(WandbSink(options.wandb, out, to_dict(config)))
        elif name == "mlflow":
            sinks.append(MLflowSink(options.mlflow, out, to_dict(config)))
        else:  # pragma: no cover - TrackerName and this function list the same names
            raise ValueError(f"unknown tracker {name!r}; use one of {TRACKERS}")
    return sinks


__all__ = ["MLflowSink", "WandbSink", "flat_params", "tracker_sinks"]
