"""Per-token text for the dashboard's token view, decoded with the model's own tokenizer on the server.

A ``samples`` event carries trajectories as ``Trajectory.to_dict(tokenizer)`` (``token_ids``, ``loss_mask``,
``logprobs``, ``turns``, ``tool_calls``, ``reward``, ``model``, ``text``, ``segments``). Each trajectory gets
``tokens`` (one decoded string per token id) here, when it is served, so the browser can colour every token
by its mask and show its logprob on hover. The browser never guesses token boundaries from text.

Only the ``tokenizers`` package (Rust, no torch) is used, reading ``tokenizer.json`` from the model folder
the trajectory names; a trajectory whose model is not a local folder with that file is served as it is, and
the browser falls back to the decoded mask spans (``segments``) the trainer stores.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# Token views of a long trajectory are long; past this many tokens the browser gets spans only.
MAX_TOKENS = 8192


@functools.lru_cache(maxsize=8)
def _tokenizer(model: str) -> Any:
    from tokenizers import Tokenizer

    path = Path(model) / "tokenizer.json"
    if not path.is_file():
        return None
    try:
        return Tokenizer.from_file(str(path))
    except Exception:
        log.warning("could not load the tokenizer of %s for the token view", model, exc_info=True)
        return None


def token_texts(token_ids: list[int], model: str | None) -> list[str] | None:
    """One decoded string per id with the tokenizer of ``model`` (a local folder), or None if unavailable."""
    if not model or not token_ids or len(token_ids) > MAX_TOKENS:
        return None
    tok = _tokenizer(str(model))
    if tok is None:
        return None
    return [tok.decode([int(i)], skip_special_tokens=False) for i in token_ids]


def trajectories_of(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The trajectory dicts of a ``samples`` event's payload (``trainer.events.SamplesData``)."""
    value = data.get("trajectories")
    return [t for t in value if isinstance(t, dict)] if isinstance(value, list) else []


def job_model_path(config: Any) -> str | None:
    """The model folder a job's config names (``{"model": {"path": ...}}``), used when a stored trajectory
    does not name its model itself (the trainer's samples do not)."""
    model = config.get("model") if isinstance(config, dict) else None
    if isinstance(model, dict) and isinstance(model.get("path"), str):
        return model["path"]
    return model if isinstance(model, str) else None


def with_token_texts(message: dict[str, Any], model: str | None = None) -> dict[str, Any]:
    """The event as sent to a browser: a ``samples`` event's trajectories gain ``tokens`` where missing,
    decoded with the tokenizer of the trajectory's own ``model`` or else of ``model`` (the job's).

    Trajectory dicts are updated in place: the message is a fresh copy made per read of the database (or
    per group message), never the stored row, and repeated calls are idempotent.
    """
    if message.get("type") != "samples" or not isinstance(message.get("data"), dict):
        return message
    for trajectory in trajectories_of(message["data"]):
        ids = trajectory.get("token_ids")
        if trajectory.get("tokens") or not isinstance(ids, list):
            continue
        texts = token_texts(ids, trajectory.get("model") or model)
        if texts is not None:
            trajectory["tokens"] = texts
    return message
