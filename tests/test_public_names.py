"""Every public name of Accelerate 1.15.0 exists in hasten at the same path (accelerate -> hasten).

The list is tests/fixtures/accelerate_public_names.txt, written by scripts/accelerate_names.py. Names that are
not built yet are listed below, grouped by the issue that builds them; an entry is a bare name (every path of
that name), a `module:name`, or a module (the module and every name in it). The test fails when a listed
name is missing from hasten, and also when a name on the not-built list has become importable: then take it
off the list, so the list only shrinks.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from launching import FIXTURES, SCRIPTS

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
# The names that refuse when used, by what they would need; tests/workers/call_public_names.py calls every name to
# tell them apart, so a name that starts refusing (or stops) fails test_count until this list says so.
REFUSED_ON_USE: dict = {
    'Amazon SageMaker jobs (hasten launches none)': [
        'hasten.commands.config.sagemaker:get_sagemaker_input',
        'hasten.commands.launch:sagemaker_launcher',
        'hasten.utils.launch:prepare_sagemager_args_inputs',
        'hasten.utils:prepare_sagemager_args_inputs',
    ],
    'MS-AMP fp8 (no longer maintained; torchao or Transformer Engine instead)': [
        'hasten.utils.dataclasses:MSAMPRecipeKwargs',
        'hasten.utils:MSAMPRecipeKwargs',
    ],
    "Megatron-LM's own library (hasten runs Megatron-LM settings with its own TP/PP/FSDP)": [
        'hasten.utils.dataclasses:add_model_config_to_megatron_parser',
        'hasten.utils.dataclasses:parse_bert_config',
        'hasten.utils.dataclasses:parse_glm4_moe_config',
        'hasten.utils.dataclasses:parse_gpt2_config',
        'hasten.utils.dataclasses:parse_llama_config',
        'hasten.utils.dataclasses:parse_t5_config',
        'hasten.utils.megatron_lm:AbstractTrainStep',
        'hasten.utils.megatron_lm:BertTrainStep',
        'hasten.utils.megatron_lm:GPTTrainStep',
        'hasten.utils.megatron_lm:MegatronEngine',
        'hasten.utils.megatron_lm:MegatronLMDummyDataLoader',
        'hasten.utils.megatron_lm:MegatronLMDummyScheduler',
        'hasten.utils.megatron_lm:MegatronLMOptimizerWrapper',
        'hasten.utils.megatron_lm:MegatronLMSchedulerWrapper',
        'hasten.utils.megatron_lm:T5TrainStep',
        'hasten.utils.megatron_lm:finish_mpu_init',
        'hasten.utils.megatron_lm:initialize',
        'hasten.utils.megatron_lm:model_provider_func',
        'hasten.utils.megatron_lm:prepare_data_loader',
        'hasten.utils.megatron_lm:prepare_model_optimizer_scheduler',
        'hasten.utils.megatron_lm:prepare_optimizer',
        'hasten.utils.megatron_lm:prepare_scheduler',
        'hasten.utils:AbstractTrainStep',
        'hasten.utils:BertTrainStep',
        'hasten.utils:GPTTrainStep',
        'hasten.utils:MegatronEngine',
        'hasten.utils:MegatronLMDummyDataLoader',
        'hasten.utils:MegatronLMDummyScheduler',
        'hasten.utils:MegatronLMOptimizerWrapper',
        'hasten.utils:MegatronLMSchedulerWrapper',
        'hasten.utils:T5TrainStep',
        'hasten.utils:add_model_config_to_megatron_parser',
        'hasten.utils:megatron_lm_initialize',
        'hasten.utils:megatron_lm_prepare_data_loader',
        'hasten.utils:megatron_lm_prepare_model_optimizer_scheduler',
        'hasten.utils:megatron_lm_prepare_optimizer',
        'hasten.utils:megatron_lm_prepare_scheduler',
    ],
    "DeepSpeed's own pdsh/hostfile launchers (hasten launches DeepSpeed through torchrun)": [
        'hasten.utils.launch:prepare_deepspeed_cmd_env',
        'hasten.utils:prepare_deepspeed_cmd_env',
    ],
}
REFUSED_KEYS = {entry for entries in REFUSED_ON_USE.values() for entry in entries}
# Built names that refuse some values: the worker's stand-in arguments hit one of those refusals.
REFUSES_SOME_VALUES = {
    "hasten.local_sgd:LocalSGD",  # a backend that cannot average whole replicas
    "hasten.utils.launch:prepare_extend_env_parallelism_config",  # sp_size on a layout not built
    "hasten.utils.launch:setup_fp8_env",  # MS-AMP's fp8_opt_level
}
# Exact: a change of state (built, refused, missing) of any name changes these numbers.
COUNTS = {"built": 944, "refused": 45, "missing": 0}


def states(workdir) -> dict:
    """{entry: ("built" | "refused" | "missing", reason)}, found by calling each name in a scratch process."""

    report = Path(workdir) / "states.json"
    subprocess.run([sys.executable, str(SCRIPTS / "call_public_names.py"), str(NAMES_FILE), str(report)],
                   cwd=workdir, env={**os.environ, "HOME": str(workdir)}, stdin=subprocess.DEVNULL,
                   capture_output=True, check=True, timeout=600)
    called = json.loads(report.read_text())
    result = {}
    for entry in ENTRIES:
        outcome = called.get(entry, "built")  # a module path: present (test_public_name) is built
        if _expected_missing(entry):
            result[entry] = ("missing", "")
        elif outcome.startswith("refused") and entry not in REFUSES_SOME_VALUES:
            result[entry] = ("refused", outcome.partition(": ")[2])
        else:
            result[entry] = ("built", "")
    return result


def test_count(capsys, tmp_path):
    found = states(tmp_path)
    counts = {state: sum(1 for s, _ in found.values() if s == state) for state in ("built", "refused", "missing")}
    with capsys.disabled():
        print(f"\npublic names of Accelerate 1.15.0 in hasten ({len(ENTRIES)}): built {counts['built']}, "
              f"refused on use {counts['refused']}, missing {counts['missing']}")
        for entry, (state, reason) in sorted(found.items()):
            if state == "refused":
                print(f"  refused: {entry}: {reason}")
    refused = {entry for entry, (state, _) in found.items() if state == "refused"}
    assert refused == REFUSED_KEYS, (
        f"refuse on use but not listed: {sorted(refused - REFUSED_KEYS)}; listed but built now: "
        f"{sorted(REFUSED_KEYS - refused)} (update REFUSED_ON_USE and COUNTS in {__file__})")
    assert counts == COUNTS, f"{counts} != {COUNTS} (update COUNTS and docs/migrating.md)"
    # a refusal always says why, in one line
    assert all(reason for state, reason in found.values() if state == "refused")
    # the names the issue named are told apart from built ones
    for entry in ("hasten.commands.launch:sagemaker_launcher",):
        assert found[entry][0] == "refused", (entry, found[entry])
    # TPU launching is built (issue 32)
    for entry in ("hasten.utils:prepare_tpu", "hasten.utils:install_xla", "hasten.commands.launch:tpu_launcher"):
        assert found[entry][0] == "built", (entry, found[entry])


# Accelerate 1.15's module-level `logger` objects: get_logger(__name__) (a MultiProcessAdapter) or
# logging.getLogger(__name__); scripts and tests patch them (`mock.patch.object(accelerate.accelerator.logger, ...)`).
# `utils.fsdp_utils` is the FSDP backend's functions module itself (one module object, so patches reach the code), and
# a backend sits below the logging adapter's floor: its logger is a plain Logger under Accelerate's name, which
# `mock.patch.object(logger, "warning")` reaches the same way.
ACCELERATE_LOGGERS = {
    "accelerator": "adapter", "state": "logger", "tracking": "adapter", "utils.modeling": "logger",
    "utils.fsdp_utils": "logger", "utils.bnb": "logger", "utils.other": "adapter", "utils.dataclasses": "logger",
    "utils.environment": "logger", "big_modeling": "logger",
}


@pytest.mark.parametrize("module", sorted(ACCELERATE_LOGGERS))
def test_accelerates_module_loggers_are_at_their_paths(module):
    import logging

    from hasten.logging import MultiProcessAdapter

    logger = getattr(importlib.import_module(f"hasten.{module}"), "logger", None)
    kind = MultiProcessAdapter if ACCELERATE_LOGGERS[module] == "adapter" else logging.Logger
    assert isinstance(logger, kind), f"hasten.{module}.logger is {logger!r}, Accelerate's is a {kind.__name__}"
    assert (logger.logger if isinstance(logger, MultiProcessAdapter) else logger).name.startswith("hasten.")


@pytest.mark.parametrize("switch", ["HASTEN_ENABLE_RICH", "ACCELERATE_ENABLE_RICH", None])
def test_import_turns_rich_tracebacks_on_with_the_switch(switch):
    # `import accelerate` imports accelerate.utils.rich when rich is installed and switched on; so does hasten.
    pytest.importorskip("rich")
    env = {k: v for k, v in os.environ.items() if not k.endswith("_ENABLE_RICH")}
    if switch:
        env[switch] = "1"
    # ... and binds it as `accelerate.rich` (`from .utils import rich`); switched off, the name is absent there too.
    code = ("import sys; hook = sys.excepthook; import hasten; "
            "print(sys.excepthook is hook, 'hasten.utils.rich' in sys.modules, "
            "getattr(hasten, 'rich', None) is sys.modules.get('hasten.utils.rich', 0))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == (["False", "True", "True"] if switch else ["True", "False", "False"])
