"""The built-in resource specs live next to their tools and register themselves there, and one function resizes
a spec's pool."""

from __future__ import annotations

import pytest

from agentfly.resources import Pool, UnknownResource
from agentfly.resources.builtin import BUILTIN_SPECS, builtin_spec, with_pool
from agentfly.tools.builtin.python_code import PYTHON_SANDBOX, python_code


def test_the_python_sandbox_spec_is_the_one_next_to_the_python_tool() -> None:
    assert builtin_spec(python_code.resource) is PYTHON_SANDBOX
    assert (PYTHON_SANDBOX.pool, PYTHON_SANDBOX.acquire_timeout) == (Pool(min=0, max=8), 60)


def test_an_unknown_resource_names_the_built_ins() -> None:
    with pytest.raises(UnknownResource, match="built-in resources: kv, python, scienceworld, textworld, wiki, workspace"):
        builtin_spec("gpu_farm")
    assert sorted(BUILTIN_SPECS) == ["kv", "python", "scienceworld", "textworld", "wiki", "workspace"]


def test_each_built_in_is_the_spec_its_module_declares_and_a_taken_name_is_refused() -> None:
    from agentfly.envs.scienceworld import SCIENCEWORLD
    from agentfly.resources.builtin import register_builtin
    from agentfly.retrieval.index import WIKI_MINI
    from agentfly.tools.builtin.lookup import KEY_CHAIN
    from agentfly.tools.builtin.workspace import WORKSPACE

    declared = {"kv": KEY_CHAIN, "python": PYTHON_SANDBOX, "wiki": WIKI_MINI, "scienceworld": SCIENCEWORLD,
                "workspace": WORKSPACE}
    assert all(BUILTIN_SPECS[name] is spec for name, spec in declared.items())
    assert register_builtin(PYTHON_SANDBOX) is PYTHON_SANDBOX  # a module imported twice registers once
    with pytest.raises(ValueError, match="'python' is already registered"):
        register_builtin(with_pool(PYTHON_SANDBOX, pool_max=2))


def test_the_resource_layer_names_no_module_of_the_layers_above_it() -> None:
    import inspect

    import agentfly.resources.builtin as builtin

    source = inspect.getsource(builtin)
    assert "importlib" not in source
    assert not any(name in source for name in ("agentfly.tools", "agentfly.envs", "agentfly.retrieval"))


def test_a_pool_override_keeps_what_it_does_not_name_and_a_lone_max_fits() -> None:
    warm = with_pool(PYTHON_SANDBOX, pool_min=3)
    assert warm.pool == Pool(min=3, max=8) and warm.acquire_timeout == 60
    assert with_pool(warm, pool_max=2).pool == Pool(min=2, max=2)  # min lowered to the new max
    renamed = with_pool(PYTHON_SANDBOX, name="py", acquire_timeout=5)
    assert (renamed.name, renamed.pool, renamed.acquire_timeout) == ("py", PYTHON_SANDBOX.pool, 5)
