"""No import cycle among the modules of feedpipe and converters (ARCHITECTURE.md): grimp's graph
counts every import statement, at the top of a file, inside a function or under TYPE_CHECKING,
so a cycle hidden by a function-level import fails here too."""

from __future__ import annotations

import grimp
import pytest


def strongly_connected(edges: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of a directed graph (Kosaraju, iterative)."""
    order: list[str] = []
    seen: set[str] = set()
    for root in edges:
        if root in seen:
            continue
        seen.add(root)
        stack = [(root, iter(edges[root]))]
        while stack:
            node, rest = stack[-1]
            nxt = next((m for m in rest if m not in seen), None)
            if nxt is None:
                order.append(node)
                stack.pop()
            else:
                seen.add(nxt)
                stack.append((nxt, iter(edges.get(nxt, ()))))
    back: dict[str, set[str]] = {n: set() for n in edges}
    for a, targets in edges.items():
        for b in targets:
            back.setdefault(b, set()).add(a)
    out, done = [], set()
    for node in reversed(order):
        if node in done:
            continue
        comp, todo = set(), [node]
        done.add(node)
        while todo:
            n = todo.pop()
            comp.add(n)
            for m in back.get(n, ()):
                if m not in done:
                    done.add(m)
                    todo.append(m)
        out.append(comp)
    return out


def test_strongly_connected_finds_cycles_only():
    comps = strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()})
    assert sorted(map(sorted, comps)) == [["a", "b", "c"], ["d"], ["e"]]


@pytest.fixture(scope="module")
def cycles() -> list[frozenset[str]]:
    graph = grimp.build_graph("feedpipe", "converters")
    edges = {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    return [frozenset(c) for c in strongly_connected(edges) if len(c) > 1]


def _edges(cycle: frozenset[str]) -> list[str]:
    graph = grimp.build_graph("feedpipe", "converters")
    return [f"{a} -> {b} (line {d['line_number']}: {d['line_contents']})"
            for a in sorted(cycle) for b in sorted(cycle)
            for d in graph.get_import_details(importer=a, imported=b)]


def test_no_import_cycle(cycles):
    """A cycle fails, naming the import lines that make it."""
    assert not cycles, "import cycles: " + "; ".join(", ".join(_edges(c)) for c in cycles)
