"""No import cycle anywhere in src/hasten, counting imports inside functions too.

A cycle that only closes inside a function still ties two rooms together (neither can be read, tested or
replaced alone) and breaks as soon as someone hoists the import. The graph is built from the source with
`ast`, so the test sees every `import` statement, wherever it sits, without importing anything.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[1] / "src" / "hasten"
PACKAGE = "hasten"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict:
    return {_module_name(path): path for path in sorted(PACKAGE_ROOT.rglob("*.py"))}


def _resolve(name: str, known: set):
    """The module `name` refers to: itself if it is a module, else the package that holds it (`pkg.attr`)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, path: Path, known: set) -> set:
    """Every hasten module `module` imports, at module level or inside any function or class."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            # `from pkg import name` imports the submodule pkg.name when there is one, else pkg itself.
            targets = [f"{prefix}.{alias.name}" if f"{prefix}.{alias.name}" in known else prefix
                       for alias in node.names]
        else:
            continue
        for target in targets:
            if target == PACKAGE or target.startswith(PACKAGE + "."):
                resolved = _resolve(target, known)
                if resolved and resolved != module:
                    found.add(resolved)
    return found


def import_graph() -> dict:
    modules = _modules()
    known = set(modules)
    graph = {name: _imports(name, path, known) for name, path in modules.items()}
    # Importing `a.b.c` runs `a/__init__` and `a/b/__init__` first; those edges are implicit, and a
    # package's own __init__ importing its children is not a cycle, so parents are not added here.
    return graph


def find_cycles(graph: dict) -> list:
    """Each strongly connected component with more than one module, as one cycle through it."""
    index, low, on_stack, stack, components = {}, {}, set(), [], []
    counter = [0]

    def visit(node):  # Tarjan, iterative enough for a package of this size
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                item = stack.pop()
                on_stack.discard(item)
                component.append(item)
                if item == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_one_cycle(graph, component) for component in components]


def _one_cycle(graph: dict, component: list) -> list:
    """A concrete path a -> b -> ... -> a inside one strongly connected component (for the message)."""
    members = set(component)
    start = component[0]
    path, seen = [start], {start}

    def walk(node):
        for target in sorted(graph[node] & members):
            if target == start:
                return True
            if target not in seen:
                seen.add(target)
                path.append(target)
                if walk(target):
                    return True
                path.pop()
        return False

    walk(start)
    return path + [start]


def test_the_graph_sees_imports_inside_functions():
    graph = import_graph()
    # accelerator.py imports checkpointing only inside save_state/load_state: the graph must still see it.
    assert "hasten.checkpoint.layout" in graph["hasten.accelerator"]
    assert "hasten.state" in graph["hasten.accelerator"]


def test_finds_a_cycle_when_there_is_one():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycles(graph) == [["a", "b", "c", "a"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_in_hasten():
    cycles = find_cycles(import_graph())
    assert not cycles, "import cycles in src/hasten (module-level or inside functions): " + "; ".join(
        " -> ".join(cycle) for cycle in cycles
    )
