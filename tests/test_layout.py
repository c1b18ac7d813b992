"""The package's layout is a contract (docs/architecture.md): a few public modules directly
under ``traceview/``, one folder per layer (each ``__init__`` saying what it is for and what it
may import), and no import cycle anywhere, local and TYPE_CHECKING imports included."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import grimp

import traceview

PACKAGE = Path(traceview.__file__).parent
ROOMS = ("store", "run", "outputs", "capture", "cli")


def import_cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Every strongly connected set of two or more modules (Tarjan), each as a sorted list."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        # iterative depth-first search: (module, its successors still to visit)
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            module, successors = work[-1]
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.find_modules_directly_imported_by(nxt)))))
                    break
                if nxt in on_stack:
                    low[module] = min(low[module], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[module])
                if low[module] == index[module]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == module:
                            break
                    if len(component) > 1:
                        cycles.append(sorted(component))
    return cycles


def test_import_cycles_are_found() -> None:
    """The search itself: a hand-made graph with one cycle of three and a self-free chain."""
    graph = grimp.ImportGraph()
    for importer, imported in [("p.a", "p.b"), ("p.b", "p.c"), ("p.c", "p.a"), ("p.c", "p.d"),
                               ("p.d", "p.e")]:
        graph.add_import(importer=importer, imported=imported)
    assert import_cycles(graph) == [["p.a", "p.b", "p.c"]]


def package_graph() -> grimp.ImportGraph:
    """grimp's graph of the package, with its compiled modules as nodes of their own: grimp
    reads only ``.py`` files, so ``import traceview.parsers.kineto._scan`` (C) is recorded as
    an import of the ``kineto`` package itself, a cycle that does not exist."""
    graph = grimp.build_graph("traceview")
    sources = set(graph.modules)
    for importer in sorted(sources):
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            details = graph.get_import_details(importer=importer, imported=imported)
            named = {name for d in details
                     for name in re.findall(r"traceview(?:\.\w+)+", d["line_contents"])}
            unseen = {n for n in named if n not in sources and n.rpartition(".")[0] == imported}
            if unseen and len(unseen) == len(named):
                graph.remove_import(importer=importer, imported=imported)
                for name in unseen:
                    graph.add_import(importer=importer, imported=name)
    return graph


def file_of(module: str) -> str:
    path = Path(*module.split("."))
    return f"{path}/__init__.py" if (PACKAGE.parent / path).is_dir() else f"{path}.py"


def test_no_import_cycles_in_the_package() -> None:
    cycles = import_cycles(package_graph())
    named = ["  " + " <-> ".join(map(file_of, cycle)) for cycle in cycles]
    assert not cycles, "import cycles:\n" + "\n".join(named)


def test_few_modules_directly_under_the_package() -> None:
    """Only the public surface and the vocabulary: open, Run and the results come through
    ``__init__``'s lazy names; everything else lives in a room."""
    modules = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(modules) <= 8, modules


def test_every_room_says_what_it_is_for_and_may_import() -> None:
    for room in ROOMS:
        doc = ast.get_docstring(ast.parse((PACKAGE / room / "__init__.py").read_text()))
        assert doc, f"traceview/{room}/__init__.py has no docstring"
        first = doc.split(". ")[0]
        assert "import" in first, f"traceview/{room}: the first sentence names what it may import"
