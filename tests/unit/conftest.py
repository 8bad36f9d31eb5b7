"""Fixtures shared by the library's unit tests.

The tiny model is built once per test session (about 7 s): a real Qwen2 model and tokenizer saved with
``save_pretrained`` and loaded back with ``from_pretrained``, so engine and rollout tests exercise the same
loading path a user's model takes. Torch is held to one thread because several test processes share the CI
machine's cores.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def tiny_model(tiny_model_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
