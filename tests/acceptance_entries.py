"""What the acceptance matrix must cover, found by introspection (tests/test_acceptance_matrix.py).

Three kinds of entry: `param:<callable>:<name>` for each parameter of the public callables users configure
runs with, `field:<class>:<name>` for each field of each plugin, kwargs handler and configuration dataclass,
and `setting:<name>` for each row of the settings table (its flag, variables and config-file key).
"""

from __future__ import annotations

import dataclasses
import inspect

CALLABLES = {
    "Accelerator": ("hasten", "Accelerator", "__init__"),
    "prepare": ("hasten", "Accelerator", "prepare"),
    "save_state": ("hasten", "Accelerator", "save_state"),
    "load_state": ("hasten", "Accelerator", "load_state"),
    "save_model": ("hasten", "Accelerator", "save_model"),
    "get_state_dict": ("hasten", "Accelerator", "get_state_dict"),
    "accumulate": ("hasten", "Accelerator", "accumulate"),
    "gather_for_metrics": ("hasten", "Accelerator", "gather_for_metrics"),
    "init_trackers": ("hasten", "Accelerator", "init_trackers"),
    "backward": ("hasten", "Accelerator", "backward"),
    "clip_grad_norm_": ("hasten", "Accelerator", "clip_grad_norm_"),
    "unwrap_model": ("hasten", "Accelerator", "unwrap_model"),
    "prepare_data_loader": ("hasten.data_loader", None, "prepare_data_loader"),
    "load_checkpoint_and_dispatch": ("hasten", None, "load_checkpoint_and_dispatch"),
    "dispatch_model": ("hasten", None, "dispatch_model"),
    "save_fsdp_model": ("hasten.utils", None, "save_fsdp_model"),
    "generate_device_map": ("hasten.inference", None, "generate_device_map"),
}
SKIP_PARAMETERS = {"self", "args", "kwargs"}  # *args/**kwargs are each callable's own entries below
CATCH_ALL = {("prepare", "args"), ("save_state", "save_model_func_kwargs"), ("load_state", "load_model_func_kwargs"),
             ("backward", "kwargs")}
DATACLASS_MODULE = "hasten.utils.dataclasses"
NOT_CONFIGURATION = {"TensorInformation"}  # a record of a tensor's shape, not configuration


def callable_entries() -> list:
    import importlib

    entries = []
    for label, (module, cls, name) in CALLABLES.items():
        owner = importlib.import_module(module)
        target = getattr(getattr(owner, cls), name) if cls else getattr(owner, name)
        for parameter in inspect.signature(target).parameters.values():
            if parameter.name in SKIP_PARAMETERS and (label, parameter.name) not in CATCH_ALL:
                continue
            entries.append(f"param:{label}:{parameter.name}")
    return entries


def field_entries() -> list:
    import importlib

    module = importlib.import_module(DATACLASS_MODULE)
    entries = []
    for name, obj in sorted(vars(module).items()):
        if inspect.isclass(obj) and dataclasses.is_dataclass(obj) and name not in NOT_CONFIGURATION:
            # a field the constructor does not take (init=False: a record the object keeps) is not configuration
            entries += [f"field:{name}:{f.name}" for f in dataclasses.fields(obj)
                        if not f.name.startswith("_") and f.init]
    return entries


def setting_entries() -> list:
    from hasten.config.settings import SETTINGS

    return [f"setting:{s.name}" for s in SETTINGS]


def all_entries() -> list:
    return callable_entries() + field_entries() + setting_entries()
