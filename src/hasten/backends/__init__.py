"""Backends: one module or folder per way of distributing a model, created through `REGISTRY`.

The run plan (`hasten/plan/`) names the backend and holds everything it is built from; `create_backend` only builds
it. To add one, write
`backends/<name>.py` (or a folder) with a `Backend` subclass, add a line here and a rule in the plan; the facade
never changes.
"""

from __future__ import annotations

import importlib

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


def create_backend(plan, state, **kwargs) -> Backend:
    """The backend the run plan names, built from the plan (and the process state it runs in)."""
    name = plan.backend
    if name not in REGISTRY:
        raise NotSupportedYetError(
            f"the {name!r} backend is not supported by hasten yet (available: {', '.join(sorted(REGISTRY))})"
        )
    module, cls = REGISTRY[name]
    return getattr(importlib.import_module(module), cls)(state, plan, **kwargs)


__all__ = ["Backend", "REGISTRY", "create_backend"]
