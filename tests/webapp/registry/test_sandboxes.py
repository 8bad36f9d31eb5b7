"""The web app provides the library's built-in resource specs, resized by a job's pools (no Django needed)."""

from __future__ import annotations

import pytest

from agentfly.resources import Pool
from agentfly.tools.builtin.python_code import PYTHON_SANDBOX
from webapp.registry.sandboxes import UnknownSandbox, specs_for


def test_the_web_app_and_the_trainer_get_the_same_python_sandbox_spec() -> None:
    (spec,) = specs_for(["python"])
    assert spec == PYTHON_SANDBOX


def test_a_jobs_pool_sizes_resize_the_built_in_spec() -> None:
    (spec,) = specs_for(["python", "python"], {"python": {"max": 2}})
    assert spec.pool == Pool(min=0, max=2) and spec.acquire_timeout == PYTHON_SANDBOX.acquire_timeout


def test_a_resource_the_web_app_cannot_provide_is_refused_with_the_known_ones_named() -> None:
    with pytest.raises(UnknownSandbox, match="known resources: kv, python, scienceworld, textworld, wiki, workspace"):
        specs_for(["gpu_farm"])
