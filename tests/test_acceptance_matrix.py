"""The acceptance matrix: every parameter, field and setting users configure a run with maps to the tests that
show its effect or its one-line refusal ("accepted means honoured", docs/honoured.md).

Entries are enumerated by introspection (tests/acceptance_entries.py); the mapping is data (tests/acceptance_map.py:
MAP entry -> "tests/<path>::<test>" or a list of them). What proves a mapping is a mutant, not a mention:
`python scripts/prove_honoured.py <entry>` drops the entry (the setting resolves to its default, the parameter is
ignored, the field keeps its default) and one of the mapped tests must fail. This file checks the data: every entry
has a map line and every mapped test exists; tests/test_honoured_sample.py runs a rotating sample of the mutants.
"""

from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
sys.path.insert(0, str(TESTS))

import acceptance_entries  # noqa: E402
import acceptance_map  # noqa: E402

HOW_TO_ADD = ("add one line per entry to MAP in tests/acceptance_map.py, 'entry': 'tests/<file>.py::<test>', naming a "
              "test that fails when the entry is dropped; check it with `python scripts/prove_honoured.py <entry>`")


@functools.lru_cache(maxsize=None)
def _tests_in(path: str) -> frozenset:
    tree = ast.parse((REPO / path).read_text())
    return frozenset(node.name for node in ast.walk(tree)
                     if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"))


def _mapped(entry: str) -> list:
    tests = acceptance_map.MAP[entry]
    return [tests] if isinstance(tests, str) else list(tests)


ENTRIES = acceptance_entries.all_entries()


def test_every_entry_has_a_map_line():
    missing = [e for e in ENTRIES if e not in acceptance_map.MAP]
    assert not missing, f"{len(missing)} entries have no map line: {missing[:20]}; {HOW_TO_ADD}"
    stale = sorted(set(acceptance_map.MAP) - set(ENTRIES))
    assert not stale, f"map lines for entries that no longer exist (delete them from tests/acceptance_map.py): {stale}"
    labelled = sorted(set(acceptance_map.CPU_PART) - set(ENTRIES))
    assert not labelled, f"CPU_PART labels for entries that do not exist: {labelled}"
    unproven = sorted(set(acceptance_map.NOT_YET_PROVEN) - set(ENTRIES))
    assert not unproven, f"NOT_YET_PROVEN names entries that do not exist: {unproven}"


@pytest.mark.parametrize("entry", sorted(acceptance_map.MAP))
def test_mapped_tests_exist(entry):
    tests = _mapped(entry)
    assert tests, f"{entry}: no test named; {HOW_TO_ADD}"
    for test in tests:
        path, _, name = test.partition("::")
        assert path.startswith("tests/") and (REPO / path).is_file(), f"{entry}: {path} does not exist"
        assert "gpu" not in Path(path).parts, f"{entry}: {test} is in the GPU suite, which CI does not run"
        assert name in _tests_in(path), f"{entry}: {path} has no test named {name}"


def test_count(capsys):
    kinds = {k: sum(1 for e in ENTRIES if e.startswith(k + ":")) for k in ("param", "field", "setting")}
    with capsys.disabled():
        print(f"\nacceptance matrix: {len(ENTRIES)} entries ({kinds['param']} parameters, {kinds['field']} fields, "
              f"{kinds['setting']} settings rows); {len(acceptance_map.CPU_PART)} shown by the CPU part of their effect")
