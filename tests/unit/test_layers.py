"""The layers hold: ``webapp -> trainer -> agentfly``, the resource layer below the agent, tool and rollout
layers, and no circle between the agent and rollout layers. grimp reads every import statement, lazy ones
inside functions too, so a deferred import that runs back up a layer fails here as well."""

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
]


@pytest.mark.parametrize(("importer", "imported"), FORBIDDEN, ids=[f"{a}-not-{b}" for a, b in FORBIDDEN])
def test_a_layer_never_imports_a_layer_above_it(importer: str, imported: str) -> None:
    chains = GRAPH.find_shortest_chains(importer=importer, imported=imported)
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
