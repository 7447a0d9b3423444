"""Every public name of Accelerate 1.15.0 exists in hasten at the same path (accelerate -> hasten).

The list is tests/fixtures/accelerate_public_names.txt, written by scripts/accelerate_names.py. Names that are
not built yet are listed below, grouped by the issue that builds them; an entry is a bare name (every path of
that name), a `module:name`, or a module (the module and every name in it). The test fails when a listed
name is missing from hasten, and also when a name on the not-built list has become importable: then take it
off the list, so the list only shrinks.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import textwrap
import warnings
from unittest import mock

import pytest
from launching import FIXTURES

NAMES_FILE = FIXTURES / "accelerate_public_names.txt"

# {reason: [names]} of Accelerate's public names hasten does not have yet (empty since issue 24: every name is at its
# path; the ones hasten has not built refuse on use, counted below).
NOT_BUILT: dict = {}
NOT_BUILT_KEYS = [key for keys in NOT_BUILT.values() for key in keys]


def _entries() -> list:
    lines = NAMES_FILE.read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


ENTRIES = _entries()


def _expected_missing(entry: str) -> bool:
    module, _, name = entry.partition(":")
    keys = set(NOT_BUILT_KEYS)
    return entry in keys or module in keys or (bool(name) and name in keys)


def _resolve(entry: str) -> bool:
    """True when `module[:name]` imports from hasten. A module that refuses to import for want of an optional
    library, with an install hint, counts as present."""
    module, _, name = entry.partition(":")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # deprecated paths (memory_utils) warn on import
            loaded = importlib.import_module(module)
    except ImportError as error:
        name_missing = getattr(error, "name", None)
        if isinstance(error, ModuleNotFoundError) and name_missing and module.startswith(name_missing):
            return False  # the module itself does not exist
        if "pip install" in str(error):
            return True
        raise
    return not name or hasattr(loaded, name)


def test_names_file_is_for_hasten_and_complete():
    assert ENTRIES == sorted(set(ENTRIES)), "regenerate with scripts/accelerate_names.py"
    assert all(entry.startswith("hasten") for entry in ENTRIES)
    # what an Accelerate user imports most, listed (a guard against a broken generator)
    for entry in ("hasten:Accelerator", "hasten.utils:gather", "hasten.utils.operations:gather",
                  "hasten.checkpointing:save_accelerator_state", "hasten.utils.constants:SAFE_WEIGHTS_NAME",
                  "hasten.commands.config", "hasten.test_utils:RegressionModel"):
        assert entry in ENTRIES, entry


def test_every_not_built_entry_names_something_on_the_list():
    stale = [key for key in NOT_BUILT_KEYS
             if not any(entry == key or entry.partition(":")[0] == key or entry.partition(":")[2] == key
                        for entry in ENTRIES)]
    assert not stale, f"entries of NOT_BUILT that match nothing in {NAMES_FILE.name}: {stale}"


@pytest.mark.parametrize("entry", ENTRIES)
def test_public_name(entry):
    present = _resolve(entry)
    if _expected_missing(entry):
        assert not present, f"{entry} is importable now: take it off NOT_BUILT in {__file__}"
    else:
        assert present, f"{entry} is missing from hasten (Accelerate 1.15.0 has it)"


# -- three states: built, refused on use (with the reason), missing ----------------------------------------------
REFUSALS = ("NotSupportedYetError", "NotBuiltError", "MegatronLMOnlyError")


def _refusing_body(function) -> bool:
    """Whether the function's first statement (after its docstring) raises one of hasten's refusal errors."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    except (OSError, TypeError, SyntaxError):
        return False
    if not tree.body or not isinstance(tree.body[0], (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False  # a lambda or an alias: built
    body = tree.body[0].body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    first = body[0] if body else None
    return (isinstance(first, ast.Raise) and isinstance(first.exc, ast.Call)
            and getattr(first.exc.func, "id", None) in REFUSALS)


def _refusal_reason(entry: str):
    """The one-line reason a name refuses when used, or None when it is built. A name refuses when it is a
    function, or a class whose __init__/__post_init__, that raises a refusal error before doing anything."""
    from hasten.core.errors import NotSupportedYetError

    module, _, name = entry.partition(":")
    if not name:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        obj = getattr(importlib.import_module(module), name, None)
    targets = [getattr(obj, m) for m in ("__init__", "__post_init__") if m in vars(obj)] if inspect.isclass(obj) \
        else [obj] if inspect.isfunction(obj) else []
    for target in targets:
        if _refusing_body(target):
            parameters = [p for p in inspect.signature(target).parameters.values()
                          if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
            args = [mock.MagicMock() for _ in parameters[1 if target.__name__.startswith("__") else 0:]]
            try:
                target(mock.MagicMock(), *args) if target.__name__.startswith("__") else target(*args)
            except NotSupportedYetError as error:
                return str(error).splitlines()[0]
            raise AssertionError(f"{entry} looks refused but did not raise when called")
    return None


def states() -> dict:
    """{entry: ("built" | "refused" | "missing", reason)}."""
    result = {}
    for entry in ENTRIES:
        if _expected_missing(entry):
            result[entry] = ("missing", "")
        else:
            reason = _refusal_reason(entry)
            result[entry] = ("refused", reason) if reason else ("built", "")
    return result


def test_count(capsys):
    found = states()
    counts = {state: sum(1 for s, _ in found.values() if s == state) for state in ("built", "refused", "missing")}
    with capsys.disabled():
        print(f"\npublic names of Accelerate 1.15.0 in hasten ({len(ENTRIES)}): built {counts['built']}, "
              f"refused on use {counts['refused']}, missing {counts['missing']}")
        for entry, (state, reason) in sorted(found.items()):
            if state == "refused":
                print(f"  refused: {entry}: {reason}")
    assert sum(counts.values()) == len(ENTRIES)
    assert counts["built"] > len(ENTRIES) // 2
    # a refusal always says why, in one line
    assert all(reason for state, reason in found.values() if state == "refused")
    # the names the issue named are told apart from built ones
    for entry in ("hasten.commands.launch:sagemaker_launcher",):
        assert found[entry][0] == "refused", (entry, found[entry])
    # TPU launching is built (issue 32)
    for entry in ("hasten.utils:prepare_tpu", "hasten.utils:install_xla", "hasten.commands.launch:tpu_launcher"):
        assert found[entry][0] == "built", (entry, found[entry])
