"""The acceptance matrix: every parameter, field and setting users configure a run with maps to the test that
shows its effect or its one-line refusal ("accepted means honoured", docs/migrating.md).

Entries are enumerated by introspection (tests/acceptance_entries.py); the mapping is data
(tests/acceptance_map.py: MAP entry -> "tests/<path>::<test>", and NOT_YET_COVERED, an explicit list that only
shrinks). The meta-test fails when an entry has no mapping, when a mapped test does not exist (parsed with ast),
or when the mapped test (with the worker scripts, fixtures and module constants it uses) never mentions the entry and its owner.

Regenerate candidates with `python tests/test_acceptance_matrix.py` (it keeps existing mappings and proposes
one for each uncovered entry whose words a test mentions; review what it adds).
"""

from __future__ import annotations

import ast
import functools
import re
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
sys.path.insert(0, str(TESTS))

import acceptance_entries  # noqa: E402
import acceptance_map  # noqa: E402


@functools.lru_cache(maxsize=None)
def _functions(path: str) -> dict:
    """{test name: source text, with the workers and same-file fixtures it uses} for one test file."""
    file = REPO / path
    text = file.read_text()
    tree = ast.parse(text)
    defs = {node.name: node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    # Module-level constants a test is parametrized over (or reads) are part of what it exercises.
    constants = {target.id: ast.get_source_segment(text, node) or "" for node in tree.body
                 if isinstance(node, ast.Assign) for target in node.targets if isinstance(target, ast.Name)}

    def body(node, seen=()):
        source = ast.get_source_segment(text, node) or ""
        for decorator in node.decorator_list:  # parametrize cases
            source += ast.get_source_segment(text, decorator) or ""
        for name in sorted(n for n in constants if re.search(rf"\b{n}\b", source)):
            source += constants[name]
        for worker in set(re.findall(r"[\"']([\w]+\.py)[\"']", source)):
            script = TESTS / "workers" / worker
            if script.is_file():
                source += script.read_text()
        for arg in node.args.args:  # fixtures of the same file
            if arg.arg in defs and arg.arg not in seen and arg.arg != node.name:
                source += body(defs[arg.arg], (*seen, node.name))
        return source

    return {name: body(node) for name, node in defs.items() if name.startswith("test_") and "gpu" not in name}


def _test_files() -> list:
    # CI runs on CPUs: the GPU suite cannot be what shows an entry
    return sorted(str(p.relative_to(REPO)) for p in TESTS.rglob("test_*.py") if not {"workers", "gpu"} & set(p.parts))


def _mentions(source: str, entry: str) -> bool:
    if not any(re.search(rf"(?<![\w-]){re.escape(w)}(?!\w)", source) for w in acceptance_entries.words(entry)):
        return False
    return all(w in source for w in acceptance_entries.owner_words(entry))


ENTRIES = acceptance_entries.all_entries()


def test_every_entry_is_mapped_or_listed_as_not_yet_covered():
    mapped, pending = set(acceptance_map.MAP), set(acceptance_map.NOT_YET_COVERED)
    assert not mapped & pending, f"both mapped and not yet covered: {sorted(mapped & pending)}"
    missing = [e for e in ENTRIES if e not in mapped and e not in pending]
    assert not missing, f"{len(missing)} entries have no test: {missing[:20]} (run python {__file__})"
    stale = sorted((mapped | pending) - set(ENTRIES))
    assert not stale, f"entries that no longer exist: {stale}"


@pytest.mark.parametrize("entry", sorted(acceptance_map.MAP))
def test_mapped_test_exists_and_exercises_the_entry(entry):
    path, _, name = acceptance_map.MAP[entry].partition("::")
    assert (REPO / path).is_file(), f"{entry}: {path} does not exist"
    functions = _functions(path)
    assert name in functions, f"{entry}: {path} has no test named {name}"
    assert _mentions(functions[name], entry), f"{entry}: {path}::{name} never mentions {acceptance_entries.words(entry)}"


def test_count(capsys):
    kinds = {k: sum(1 for e in ENTRIES if e.startswith(k + ":")) for k in ("param", "field", "setting")}
    with capsys.disabled():
        print(f"\nacceptance matrix: {len(ENTRIES)} entries ({kinds['param']} parameters, {kinds['field']} fields, "
              f"{kinds['setting']} settings rows); mapped {len(acceptance_map.MAP)}, not yet covered "
              f"{len(acceptance_map.NOT_YET_COVERED)}")


def _propose() -> None:
    """Write tests/acceptance_map.py: existing mappings kept, a candidate for each other entry."""
    files = _test_files()
    found, pending = dict(acceptance_map.MAP), []
    for entry in ENTRIES:
        if entry in found:
            continue
        for path in files:
            hit = next((name for name, source in _functions(path).items() if _mentions(source, entry)), None)
            if hit:
                found[entry] = f"{path}::{hit}"
                break
        else:
            pending.append(entry)
    lines = ['"""The acceptance matrix data (see tests/test_acceptance_matrix.py): entry -> the test that shows it."""',
             "", "MAP = {"]
    lines += [f"    {entry!r}: {found[entry]!r}," for entry in ENTRIES if entry in found]
    lines += ["}", "", "# Entries no test exercises yet: this list only shrinks.", "NOT_YET_COVERED = ["]
    lines += [f"    {entry!r}," for entry in pending]
    lines += ["]", ""]
    (TESTS / "acceptance_map.py").write_text("\n".join(lines))
    print(f"mapped {len(found)}, not yet covered {len(pending)}")


if __name__ == "__main__":
    _propose()
