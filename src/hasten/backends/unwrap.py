"""Strip the containers hasten (or the user) put around a model: DDP, DataParallel, FSDP1, DeepSpeed's engine,
torch.compile."""

from __future__ import annotations

import sys

import torch


def _containers():
    types = [torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel]
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel

        types.append(FullyShardedDataParallel)
    except ImportError:  # pragma: no cover - torch without distributed
        pass
    engine_module = sys.modules.get("deepspeed.runtime.engine")  # only once deepspeed is in use
    if engine_module is not None:
        types.append(engine_module.DeepSpeedEngine)
    return tuple(types)


def is_compiled(model) -> bool:
    """Whether `model` is what `torch.compile` returned (an `OptimizedModule` around the user's module)."""
    return hasattr(torch, "_dynamo") and isinstance(model, torch._dynamo.eval_frame.OptimizedModule)


def is_fsdp1(module) -> bool:
    from torch.distributed.fsdp import FullyShardedDataParallel

    return isinstance(module, FullyShardedDataParallel)


def is_fsdp2(module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


def unwrap_model(model, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True, recursive: bool = False):
    """The user's own module inside any wrappers; optionally also undo hasten's mixed-precision forward."""
    containers = _containers()
    compiled = None
    regions = False
    if is_compiled(model):
        compiled = model
        model = model._orig_mod
    elif "_orig_mod" in model.__dict__:  # the new tree of compile_regions: the original is a plain attribute
        compiled, regions = model, True
        model = model.__dict__["_orig_mod"]
    while isinstance(model, containers):
        model = model.module
    if recursive:
        for name, child in list(model.named_children()):
            setattr(model, name, unwrap_model(child, keep_fp32_wrapper, keep_torch_compile, recursive))
    if not keep_fp32_wrapper:
        from ..training.precision import remove_precision_wrapper

        remove_precision_wrapper(model)
    if compiled is not None and keep_torch_compile:
        if regions:
            compiled.__dict__["_orig_mod"] = model
        else:
            compiled._orig_mod = model
        return compiled
    return model
