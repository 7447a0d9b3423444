"""The floors: hasten's packages stand in one order, computed from their imports, and an import runs down it.

A package here is a first-level name under `hasten`: a subpackage (`hasten.checkpoint`, `hasten.backends`) or a
top-level module (`hasten.state`, `hasten.accelerator`). The package graph is the module graph of the cycle test
(`ast`, every `import` wherever it sits, imports inside functions included) with each module replaced by its
package. With the few upward imports named below taken out, that graph must have no loop: then its topological
order is the floor order (`package_order()`), and nothing keeps it by hand. A loop between packages means neither
can be read, tested or reused alone; the failure names the loop and the module imports that close it.

An upward import that must stay is named in UPWARD with its reason and its exact module imports: a new module
import under the same package edge fails (name it, or move what it needs down), one that went away fails (take
it out), and an entry whose edge no longer closes a loop fails, so the list only shrinks.
"""

from __future__ import annotations

import functools

import test_import_cycles

# parsed once for the whole file: the graph is read from ~250 source files
import_graph = functools.lru_cache(maxsize=1)(test_import_cycles.import_graph)

# (importer package, imported package) -> (why it stays, the module imports it is made of)
UPWARD = {
    ("distributed", "state"): (
        "Accelerate's public collectives (gather, broadcast, reduce...) and set_seed(device_specific=True) ask the "
        "shared PartialState who this process is, as Accelerate's do; the state itself joins the process group "
        "through distributed/",
        {("hasten.distributed.operations", "hasten.state"), ("hasten.distributed.rng", "hasten.state")},
    ),
    ("big_model", "big_modeling"): (
        "load_and_quantize_model (Accelerate's utils.bnb) ends in Accelerate's dispatch_model/init_empty_weights, "
        "whose home is the public big_modeling.py (itself built on big_model/ and hooks.py)",
        {("hasten.big_model.bnb", "hasten.big_modeling")},
    ),
}
MOST_UPWARD = 2  # issue 39: at most two named upward imports between packages


def package_of(module: str) -> str:
    """`hasten.checkpoint.storage.folder` -> `checkpoint`; `hasten.state` -> `state`; `hasten` -> `hasten`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def package_edges(graph: dict) -> dict:
    """{(importer package, imported package): {(importer module, imported module), ...}} across packages."""
    edges = {}
    for importer, imported_modules in graph.items():
        for imported in imported_modules:
            pair = (package_of(importer), package_of(imported))
            if pair[0] != pair[1]:
                edges.setdefault(pair, set()).add((importer, imported))
    return edges


def _reaches(edges, start: str, goal: str) -> bool:
    seen, todo = set(), [start]
    while todo:
        node = todo.pop()
        if node == goal:
            return True
        if node not in seen:
            seen.add(node)
            todo.extend(b for (a, b) in edges if a == node)
    return False


def find_loop(edges) -> list:
    """One loop of packages [a, b, ..., a] in `edges` ((a, b) pairs), or [] when there is none."""
    nodes = sorted({n for pair in edges for n in pair})
    for node in nodes:
        # a path from one of node's imports back to node
        for (a, b) in sorted(edges):
            if a != node:
                continue
            path = _path(edges, b, node)
            if path:
                return [node] + path
    return []


def _path(edges, start, goal):
    parent, todo = {start: None}, [start]
    while todo:
        node = todo.pop(0)
        if node == goal:
            path = []
            while node is not None:
                path.append(node)
                node = parent[node]
            return path[::-1]
        for (a, b) in sorted(edges):
            if a == node and b not in parent:
                parent[b] = node
                todo.append(b)
    return None


def package_order(graph: dict, upward=UPWARD) -> list:
    """The floors, lowest first: a package stands above every package it imports (the UPWARD imports left out).
    Ties are broken by name, so the order is the same on every run."""
    edges = {pair for pair in package_edges(graph) if pair not in upward}
    nodes = {package_of(m) for m in graph} | {n for pair in edges for n in pair}
    below = {n: {b for (a, b) in edges if a == n} for n in nodes}
    order, placed = [], set()
    while len(order) < len(nodes):
        ready = sorted(n for n in nodes if n not in placed and below[n] <= placed)
        if not ready:
            raise AssertionError("the packages form a loop: " + " -> ".join(find_loop(edges)))
        order.append(ready[0])
        placed.add(ready[0])
    return order


def _loop_words(graph, edges) -> str:
    loop = find_loop(edges)
    made_of = package_edges(graph)
    steps = []
    for a, b in zip(loop, loop[1:]):
        modules = ", ".join(f"{x} -> {y}" for x, y in sorted(made_of[(a, b)])[:3])
        steps.append(f"  {a} -> {b}: {modules}")
    return ("the packages form a loop (move what the lower one needs down, or import it from where it lives lower; "
            "if it must stay, name it in UPWARD in tests/test_floors.py):\n" + "\n".join(steps))


def test_the_packages_stand_in_one_order_without_a_loop():
    graph = import_graph()
    edges = {pair for pair in package_edges(graph) if pair not in UPWARD}
    assert not find_loop(edges), _loop_words(graph, edges)
    order = package_order(graph)
    # core needs nothing of hasten; the facade stands above the machinery it delegates to
    assert order[0] == "core" and not any(a == "core" for (a, _) in package_edges(graph)), order
    assert all(order.index("accelerator") > order.index(p) for p in ("state", "backends", "checkpoint", "data")), order


def test_at_most_two_upward_imports_each_named_with_its_modules():
    assert len(UPWARD) <= MOST_UPWARD, f"{len(UPWARD)} upward imports between packages; at most {MOST_UPWARD}"
    graph = import_graph()
    made_of = package_edges(graph)
    for pair, (why, modules) in UPWARD.items():
        assert why, pair
        assert made_of.get(pair, set()) == modules, (
            f"{pair[0]} -> {pair[1]} is now made of {sorted(made_of.get(pair, set()))}, UPWARD names "
            f"{sorted(modules)}: name a new import (or move what it needs down), take out one that went away")


def test_every_named_upward_import_still_closes_a_loop():
    # An upward import is one the order could not hold: the imported package reaches the importer again. An entry
    # whose edge no longer does is stale and must go (the list only shrinks).
    graph = import_graph()
    others = {pair for pair in package_edges(graph) if pair not in UPWARD}
    stale = [pair for pair in UPWARD if not _reaches(others, pair[1], pair[0])]
    assert not stale, "UPWARD names imports that no longer run up (remove them): " + ", ".join(
        f"{a} -> {b}" for a, b in stale)


def test_the_check_sees_a_loop_and_orders_the_rest():
    graph = {"hasten.low.a": {"hasten.high.b"}, "hasten.high.b": {"hasten.low.c"}, "hasten.low.c": set(),
             "hasten.core.x": set(), "hasten.low": {"hasten.core.x"}}
    edges = set(package_edges(graph))
    assert edges == {("low", "high"), ("high", "low"), ("low", "core")}
    assert find_loop(edges) in (["high", "low", "high"], ["low", "high", "low"])
    assert package_order(graph, upward={("low", "high"): ("", set())}) == ["core", "low", "high"]
    assert package_of("hasten.state") == "state" and package_of("hasten") == "hasten"


def test_imports_inside_functions_count():
    # plan/rules.py imports ParallelismConfig only inside functions: the graph must still see it.
    assert "hasten.parallelism_config" in import_graph()["hasten.plan.rules"]
