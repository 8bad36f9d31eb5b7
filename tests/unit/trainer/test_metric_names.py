"""Metric names are paths to the file-based trackers (MLflow's file store writes ``a/b`` as file ``b`` in
folder ``a``), so no name may be the folder of another: ``x`` beside ``x/y`` disables the MLflow sink."""

from __future__ import annotations

from trainer.metrics import summary_metrics


def row(**extra: object) -> dict[str, object]:
    return {"reward": 1.0, "length": 4, "turns": 1, "tool_calls": 1, "tool_errors": 0, "parse_errors": 0,
            "error": False, "finish": "answer", **extra}


def test_no_metric_name_is_the_folder_of_another() -> None:
    rows = [row(), row(reward_error="KeyError"), row(failure="node_lost")]
    for prefix in ("", "eval/"):
        names = set(summary_metrics(rows, prefix))
        folders = {name.rsplit("/", 1)[0] for name in names if "/" in name}
        assert not names & folders, sorted(names & folders)
