"""The web app's modules import one way: the user side (actions) -> tasks -> the worker side, never back."""

from __future__ import annotations

import grimp


def test_no_webapp_module_imports_a_module_that_imports_it_back() -> None:
    # grimp reads every import statement, those inside functions too: a lazy import is still a cycle.
    graph = grimp.build_graph("webapp", cache_dir=None)
    cycles = []
    for importer in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            back = graph.find_shortest_chain(importer=imported, imported=importer)
            if back:
                cycles.append(" -> ".join((importer, *back)))
    assert not cycles, "import cycles among webapp modules:\n" + "\n".join(cycles)
