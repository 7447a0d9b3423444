"""Backends: one module per way of distributing a model, chosen through `REGISTRY`.

To add one, write `backends/<name>.py` with a `Backend` subclass and add a line here; the facade
never changes.
"""

from __future__ import annotations

import importlib

from ..core.enums import DistributedType
from ..core.errors import NotSupportedYetError
from .base import Backend

# name -> (module, class)
REGISTRY = {
    "single": ("hasten.backends.single", "SingleBackend"),
    "ddp": ("hasten.backends.ddp", "DDPBackend"),
    "fsdp": ("hasten.backends.fsdp.backend", "FSDPBackend"),
    "deepspeed": ("hasten.backends.deepspeed.backend", "DeepSpeedBackend"),
    "tensor_parallel": ("hasten.backends.tensor_parallel", "TensorParallelBackend"),
    "pipeline": ("hasten.backends.pipeline", "PipelineBackend"),
    "xla": ("hasten.backends.xla.backend", "XLABackend"),
}

# Which backend serves each distributed type (absent: not supported yet).
_FOR_TYPE = {DistributedType.NO: "single", DistributedType.FSDP: "fsdp", DistributedType.DEEPSPEED: "deepspeed",
             DistributedType.XLA: "xla"}


def backend_name_for(distributed_type: DistributedType, num_processes: int, parallelism_config=None) -> str:
    from ..parallelism_config import backend_name

    if backend_name(parallelism_config) is not None:  # pipeline/tensor/context parallel layouts, with or without FSDP
        return backend_name(parallelism_config)
    if distributed_type in _FOR_TYPE:
        return _FOR_TYPE[distributed_type]
    return "ddp" if num_processes > 1 else "single"


def create_backend(name: str, state, **kwargs) -> Backend:
    if name not in REGISTRY:
        raise NotSupportedYetError(
            f"the {name!r} backend is not supported by hasten yet (available: {', '.join(sorted(REGISTRY))})"
        )
    module, cls = REGISTRY[name]
    return getattr(importlib.import_module(module), cls)(state, **kwargs)


__all__ = ["Backend", "REGISTRY", "backend_name_for", "create_backend"]
