"""The import graph of ragpulse.pipeline and ragpulse.judges stays a one-way street: no import
circle between
modules, and the judges never import the pipeline (they run inside Beam workers and in tools
that know nothing of Kafka or the serve loop). Read with grimp, import-linter's graph library,
which sees imports inside functions and under TYPE_CHECKING too."""

from __future__ import annotations

import grimp

PACKAGE = "ragpulse"


def _graph() -> grimp.ImportGraph:
    return grimp.build_graph(PACKAGE, cache_dir=None)


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


def _folder(module: str) -> str:
    """The folder a module is in, as a package name: `ragpulse.pipeline.metrics` for
    `ragpulse.pipeline.metrics.collector`; a module directly in pipeline/ or judges/ (canaries,
    records...) is a folder of its own, as it is a concern of its own."""
    parts = module.split(".")
    return ".".join(parts[:3]) if len(parts) > 3 else module


def _folder_graph(graph: grimp.ImportGraph) -> grimp.ImportGraph:
    """The import graph between folders: one folder imports another when any of its modules
    imports any of the other's (imports inside one folder left out)."""
    folders = grimp.ImportGraph()
    for importer in graph.modules:
        folders.add_module(_folder(importer))
        for imported in graph.find_modules_directly_imported_by(importer):
            if _folder(imported) != _folder(importer):
                folders.add_module(_folder(imported))
                folders.add_import(importer=_folder(importer), imported=_folder(imported))
    return folders


def test_no_two_folders_import_each_other() -> None:
    """Modules may avoid a circle while their folders form one (metrics/collector imported
    canaries.py, which imports metrics/catalogue): each pair of folders is one-way."""
    assert _circles(_folder_graph(_graph())) == []


def test_a_circle_between_folders_is_found_when_there_is_one() -> None:
    collector, catalogue, canaries = (
        "ragpulse.pipeline.metrics.collector",
        "ragpulse.pipeline.metrics.catalogue",
        "ragpulse.pipeline.canaries",
    )
    graph = grimp.ImportGraph()
    for module in (collector, catalogue, canaries):
        graph.add_module(module)
    graph.add_import(importer=canaries, imported=catalogue)
    graph.add_import(importer=collector, imported=catalogue)
    assert _circles(graph) == []
    assert _circles(_folder_graph(graph)) == []
    graph.add_import(importer=collector, imported=canaries)
    assert _circles(graph) == []  # no module circle...
    assert _circles(_folder_graph(graph)) == [  # ...but a folder circle
        ["ragpulse.pipeline.canaries", "ragpulse.pipeline.metrics"]
    ]


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
    chains = graph.find_shortest_chains(
        importer="ragpulse.judges", imported="ragpulse.pipeline", as_packages=True
    )
    assert chains == set()


# The layers of ragpulse.pipeline, top to bottom: a module imports only from its own layer or
# below. Commands parse flags and start things; the serve loop and the exporter run cycles;
# settings turn flags into typed configuration for the graphs; the graphs wire stages, sources
# and sinks (the metrics collector and its HTTP server are the service's sinks); the rest is typed
# data and pure functions (formats, costs, metric names and keys, windows, labels...).
# ragpulse.judges sits below all of them (test above).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("ragpulse.pipeline.cli", "ragpulse.pipeline.commands"),
    ("ragpulse.pipeline.service", "ragpulse.pipeline.review"),
    ("ragpulse.pipeline.settings",),
    ("ragpulse.pipeline.graphs",),
    (
        "ragpulse.pipeline.stages",
        "ragpulse.pipeline.sinks",
        "ragpulse.pipeline.sources",
        "ragpulse.pipeline.metrics.collector",
        "ragpulse.pipeline.metrics.http",
    ),
)


def _layer(module: str) -> int:
    """The index of a pipeline module's layer in LAYERS; len(LAYERS) for the bottom one."""
    for index, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return index
    return len(LAYERS)


def _upward_imports(graph: grimp.ImportGraph) -> list[tuple[str, str]]:
    return sorted(
        (importer, imported)
        for importer in graph.modules
        if importer.startswith("ragpulse.pipeline")
        for imported in graph.find_modules_directly_imported_by(importer)
        if imported.startswith("ragpulse.pipeline") and _layer(imported) < _layer(importer)
    )


def test_no_module_of_pipeline_imports_from_a_layer_above_its_own() -> None:
    assert _upward_imports(_graph()) == []


def test_an_upward_import_is_found_when_there_is_one() -> None:
    stages, loop, events = (
        "ragpulse.pipeline.stages.parse",
        "ragpulse.pipeline.service.loop",
        "ragpulse.pipeline.formats.events",
    )
    graph = grimp.ImportGraph()
    for module in (stages, loop, events):
        graph.add_module(module)
    graph.add_import(importer=loop, imported=stages)
    graph.add_import(importer=stages, imported=events)
    assert _upward_imports(graph) == []
    graph.add_import(importer=stages, imported=loop)
    assert _upward_imports(graph) == [(stages, loop)]
