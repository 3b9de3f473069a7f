"""The import graph of pipeline/ and judges/ stays a one-way street: no import circle between
modules, and the judges never import the pipeline (they run inside Beam workers and in tools
that know nothing of Kafka or the serve loop). Read with grimp, import-linter's graph library,
which sees imports inside functions and under TYPE_CHECKING too."""

from __future__ import annotations

import grimp

PACKAGES = ("pipeline", "judges")


def _graph() -> grimp.ImportGraph:
    return grimp.build_graph(*PACKAGES, cache_dir=None)


def _circles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    counter = 0
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append(
                        (child, iter(sorted(graph.find_modules_directly_imported_by(child))))
                    )
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    circles.append(sorted(component))
    return circles


def test_no_module_of_pipeline_or_judges_imports_itself_through_a_circle() -> None:
    assert _circles(_graph()) == []


def test_a_circle_is_found_when_there_is_one() -> None:
    graph = grimp.ImportGraph()
    for module in ("a", "b", "c", "d"):
        graph.add_module(module)
    graph.add_import(importer="a", imported="b")
    graph.add_import(importer="b", imported="c")
    graph.add_import(importer="c", imported="a")
    graph.add_import(importer="c", imported="d")
    assert _circles(graph) == [["a", "b", "c"]]


def test_the_judges_never_import_the_pipeline() -> None:
    graph = _graph()
    chains = graph.find_shortest_chains(importer="judges", imported="pipeline", as_packages=True)
    assert chains == set()
