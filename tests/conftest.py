"""Fixtures shared by every test package.

``tiny_model_dir``: the real tiny Qwen2 model and tokenizer, built once per test session (about 7 s) and saved
with ``save_pretrained``, so engine, rollout, trainer and web-app tests load it through the same
``from_pretrained`` path a user's model takes. Tests that change weights copy it first.
"""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch

    from agentfly.models import build_tiny

    torch.set_num_threads(1)  # several test processes share the machine's cores
    return build_tiny(tmp_path_factory.mktemp("tiny-model"), seed=0)
