"""The web app's modules import one way: the user side (actions) -> tasks -> the worker side, never back; and
the jobs app -> the monitor app."""

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


def test_the_jobs_app_depends_on_the_monitor_app_and_never_the_reverse() -> None:
    # The monitor app stores, announces and reads events; the jobs app (its actions, worker, API and the
    # dashboard's pages) writes and shows them. The monitor reaches a job only through JobEvent's foreign key.
    graph = grimp.build_graph("webapp", cache_dir=None)
    back = graph.find_shortest_chains(importer="webapp.monitor", imported="webapp.jobs", as_packages=True)
    assert not back, "webapp.monitor imports webapp.jobs:\n" + "\n".join(" -> ".join(chain) for chain in sorted(back))
    assert graph.chain_exists(importer="webapp.jobs", imported="webapp.monitor", as_packages=True)
