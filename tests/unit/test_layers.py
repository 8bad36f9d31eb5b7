"""The layers hold: ``webapp -> trainer -> agentfly``, the resource layer below the agent, tool and rollout
layers, each tie between two packages in one direction only, and no import circle anywhere. grimp reads every
import statement, lazy ones inside functions too, so a deferred import that runs back up a layer fails here
as well."""

from __future__ import annotations

import grimp
import pytest

GRAPH = grimp.build_graph("agentfly", "trainer", "webapp", cache_dir=None)

# (importer, imported): the importer must never reach the imported package, directly or through others.
FORBIDDEN = [
    ("agentfly", "trainer"),
    ("agentfly", "webapp"),
    ("trainer", "webapp"),
    ("agentfly.resources", "agentfly.agents"),
    ("agentfly.resources", "agentfly.tools"),
    ("agentfly.resources", "agentfly.rollout"),
    ("agentfly.rollout", "agentfly.agents"),
    # Ties between neighbours, each one way: a judge resource runs an engine (the engines raise the failure
    # types from agentfly.failures, below both); a tool's module may ship its task's reward, and a reward
    # reads a resource's state, never a tool; a task source lists an environment's tasks; the registry's
    # entries belong to the accounts' teams (the token page's example reaches the registry through its tag).
    ("agentfly.engines", "agentfly.resources"),
    ("agentfly.rewards", "agentfly.tools"),
    ("agentfly.envs", "agentfly.tasks"),
    ("webapp.accounts", "webapp.registry"),
]


@pytest.mark.parametrize(("importer", "imported"), FORBIDDEN, ids=[f"{a}-not-{b}" for a, b in FORBIDDEN])
def test_a_layer_never_imports_a_layer_above_it(importer: str, imported: str) -> None:
    chains = GRAPH.find_shortest_chains(importer=importer, imported=imported, as_packages=True)
    assert not chains, f"{importer} must not import {imported}:\n" + "\n".join(" -> ".join(c) for c in sorted(chains))


def test_no_trainer_module_imports_a_module_that_imports_it_back() -> None:
    # A circle is two modules each reaching the other through some chain of imports (lazy ones too): the
    # step would then read only from the middle. Shared types and helpers live in a module below both.
    modules = sorted(GRAPH.find_descendants("trainer") | {"trainer"})
    circles = sorted(
        f"{a} <-> {b}" for a in modules for b in GRAPH.find_upstream_modules(a)
        if b.split(".")[0] == "trainer" and a < b and a in GRAPH.find_upstream_modules(b)
    )
    assert not circles, "import circles inside trainer:\n" + "\n".join(circles)


def test_no_module_anywhere_imports_a_module_that_imports_it_back() -> None:
    # The circles found and broken: rollout.mask <-> rollout.trajectory (the trajectory decodes its own mask
    # segments), and agentfly <-> envs.scienceworld <-> tasks (the environment finds its package root by path).
    modules = sorted(GRAPH.modules)
    circles = sorted(
        f"{a} <-> {b}" for a in modules for b in GRAPH.find_modules_directly_imported_by(a)
        if GRAPH.chain_exists(importer=b, imported=a)
    )
    assert not circles, "import circles:\n" + "\n".join(circles)
