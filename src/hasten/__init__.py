"""hasten: one plain PyTorch training loop, on a CPU, one GPU, many GPUs or many machines.

Public names load on first use, so `import hasten` costs little more than `import torch`.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    "Accelerator": "hasten.accelerator",
    "PartialState": "hasten.state",
    "AcceleratorState": "hasten.state",
    "GradientState": "hasten.state",
    "DistributedType": "hasten.core.enums",
    "skip_first_batches": "hasten.data_loader",
    "notebook_launcher": "hasten.launchers",
    "debug_launcher": "hasten.launchers",
    "AutocastKwargs": "hasten.config.handlers",
    "DataLoaderConfiguration": "hasten.config.handlers",
    "DDPCommunicationHookType": "hasten.core.enums",
    "DistributedDataParallelKwargs": "hasten.config.handlers",
    "GradScalerKwargs": "hasten.config.handlers",
    "InitProcessGroupKwargs": "hasten.config.handlers",
    "ProfileKwargs": "hasten.config.handlers",
    "ProjectConfiguration": "hasten.config.handlers",
    "GradientAccumulationPlugin": "hasten.config.handlers",
    "TorchDynamoPlugin": "hasten.config.handlers",
    "FullyShardedDataParallelPlugin": "hasten.config.fsdp",
    "ParallelismConfig": "hasten.parallelism_config",
    "DeepSpeedPlugin": "hasten.config.deepspeed",
    "find_executable_batch_size": "hasten.training.memory",
    "synchronize_rng_states": "hasten.distributed.rng",
    "set_seed": "hasten.distributed.rng",
    "get_logger": "hasten.logging",
    "load_checkpoint_in_model": "hasten.big_model.loading",
    # big-model inference
    "init_empty_weights": "hasten.big_modeling",
    "init_on_device": "hasten.big_modeling",
    "cpu_offload": "hasten.big_modeling",
    "cpu_offload_with_hook": "hasten.big_modeling",
    "disk_offload": "hasten.big_modeling",
    "dispatch_model": "hasten.big_modeling",
    "load_checkpoint_and_dispatch": "hasten.big_modeling",
    "infer_auto_device_map": "hasten.big_model.device_map",
    "prepare_pippy": "hasten.inference",
    # -- surface --
    "is_rich_available": "hasten.core.availability",
}

__all__ = ["__version__", *_EXPORTS]


def _rich_tracebacks() -> None:
    """As `import accelerate`: with rich installed and HASTEN_ENABLE_RICH=1 (or ACCELERATE_ENABLE_RICH=1), rich
    draws uncaught tracebacks and `hasten.rich` is `hasten.utils.rich`. Off by default, and then nothing more is
    imported."""
    import os

    if not (os.environ.get("HASTEN_ENABLE_RICH") or os.environ.get("ACCELERATE_ENABLE_RICH")):
        return  # the usual case: nothing more to import
    from .core.availability import is_rich_available

    if is_rich_available():
        globals()["rich"] = importlib.import_module("hasten.utils.rich")


_rich_tracebacks()


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'hasten' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
