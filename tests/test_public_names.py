"""Every public name of Accelerate 1.15.0 exists in hasten at the same path (accelerate -> hasten).

The list is tests/fixtures/accelerate_public_names.txt, written by scripts/accelerate_names.py. Names that are
not built yet are listed below, grouped by the issue that builds them; an entry is a bare name (every path of
that name), a `module:name`, or a module (the module and every name in it). The test fails when a listed
name is missing from hasten, and also when a name on the not-built list has become importable: then take it
off the list, so the list only shrinks.
"""

from __future__ import annotations

import importlib
import warnings
from pathlib import Path

import pytest
from launching import FIXTURES

NAMES_FILE = FIXTURES / "accelerate_public_names.txt"

NOT_BUILT = {
    "no issue yet (SageMaker, TPU launchers)": [
        "prepare_sagemager_args_inputs", "hasten.commands.launch:sagemaker_launcher",
        "hasten.commands.launch:tpu_launcher", "hasten.commands.launch:tpu_pod_launcher",
    ],
    "not built: Accelerate's MRPC test loaders download the bert-base-cased tokenizer from the Hub and read "
    "Accelerate's own sample CSV files; hasten's test utilities do not contact the Hub": [
        "hasten.test_utils.training:mocked_dataloaders",
        "hasten.test_utils.training:mocked_dataloaders_for_autoregressive_models",
    ],
}
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


def test_count(capsys):
    built = sum(1 for entry in ENTRIES if not _expected_missing(entry))
    with capsys.disabled():
        print(f"\npublic names of Accelerate 1.15.0 built in hasten: {built} / {len(ENTRIES)}")
    assert built > len(ENTRIES) // 2
