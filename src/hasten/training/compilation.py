"""torch.compile for whole models and for regions (each block of a repeated stack compiled on its own).

A transformer is mostly N copies of one block class. Compiling the whole model traces all N; compiling
each block separately traces the class once and reuses the graph for the other N-1 blocks (dynamo's
cache is keyed by code object and guards, not by which block instance runs), so cold start drops roughly
N-fold while the steady-state speed stays close to whole-model compilation.
"""

from __future__ import annotations

import torch


def _optimized_module_type():
    return getattr(getattr(torch, "_dynamo", None), "eval_frame", None) and torch._dynamo.eval_frame.OptimizedModule


def _compiled_in_place(module: torch.nn.Module) -> bool:
    return getattr(module, "_compiled_call_impl", None) is not None


def is_repeated_blocks(module: torch.nn.Module) -> bool:
    """A non-empty `ModuleList` whose children are all instances of the first child's class."""
    return (
        isinstance(module, torch.nn.ModuleList)
        and len(module) > 0
        and all(isinstance(child, type(module[0])) for child in module)
    )


def has_repeated_blocks(module: torch.nn.Module) -> bool:
    """Whether `module` or anything below it is a stack of repeated blocks."""
    return any(is_repeated_blocks(sub) for sub in module.modules())


def has_compiled_regions(module: torch.nn.Module) -> bool:
    """Whether a submodule (not `module` itself) was compiled, by `torch.compile(sub)` or `sub.compile()`."""
    optimized = _optimized_module_type()
    return any(
        (optimized and isinstance(sub, optimized)) or _compiled_in_place(sub)
        for name, sub in module.named_modules() if name
    )


def compile_regions(module: torch.nn.Module, **compile_kwargs) -> torch.nn.Module:
    """Regional compilation that leaves `module` untouched: returns a new module tree, sharing the same
    parameters, in which each repeated block is a `torch.compile`d module and every part of the model
    outside the repeated stacks is compiled whole. The result keeps the original in `_orig_mod`.

    The new tree's `state_dict` names blocks `..._orig_mod...` (hasten's checkpoints load either way); to keep
    the names (and hooks) unchanged, use `compile_regions_in_place` instead, as `Accelerator.prepare` does
    under FSDP2 and DeepSpeed.
    """
    compiled = _regions_copy(module, compile_kwargs)
    if "_orig_mod" not in compiled.__dict__:
        # Plain attribute, not a submodule, so the original's weights are not listed twice in state_dict.
        compiled.__dict__["_orig_mod"] = module
    return compiled


def _regions_copy(module: torch.nn.Module, compile_kwargs: dict) -> torch.nn.Module:
    if is_repeated_blocks(module):
        return torch.nn.ModuleList(torch.compile(block, **compile_kwargs) for block in module)
    if not has_repeated_blocks(module):
        return torch.compile(module, **compile_kwargs)
    # A container on the way to a repeated stack: a shallow twin with its own children table, and
    # methods bound to the original (forward wrappers put there by hooks or mixed precision) re-bound.
    twin = module.__class__.__new__(module.__class__)
    twin.__dict__.update(module.__dict__)
    for name, value in module.__dict__.items():
        if getattr(value, "__self__", None) is module and hasattr(value, "__func__"):
            twin.__dict__[name] = value.__func__.__get__(twin)
    twin._modules = {}
    for name, child in module.named_children():
        twin._modules[name] = _regions_copy(child, compile_kwargs)
    return twin


def compile_regions_in_place(module: torch.nn.Module, **compile_kwargs) -> torch.nn.Module:
    """Regional compilation with `nn.Module.compile()`: the model keeps its identity, its parameter and
    state_dict names, and the hooks that wrappers (DDP, FSDP2, DeepSpeed) add before or after. Returns
    `module`."""
    if is_repeated_blocks(module):
        for block in module:
            block.compile(**compile_kwargs)
    elif has_repeated_blocks(module):
        for child in module.children():
            compile_regions_in_place(child, **compile_kwargs)
    else:
        module.compile(**compile_kwargs)
    return module


# Accelerate's names for the in-place form, one per engine that needs hooks kept.
compile_regions_deepspeed = compile_regions_in_place
compile_regions_fsdp2 = compile_regions_in_place


def compile_model(model: torch.nn.Module, dynamo_plugin, regions_in_place: bool = False) -> torch.nn.Module:
    """What `Accelerator.prepare` does with a `TorchDynamoPlugin` whose backend is set: with
    `use_regional_compilation`, Accelerate's regional compilation for the backend (`regions_in_place`: each
    block compiled in place, as under FSDP2/DeepSpeed; else `compile_regions`' new tree, as on one device, DDP
    and FSDP1), else `torch.compile` of the whole model. A model the user compiled already (whole or by
    regions, e.g. with `compile_regions_in_place` before `prepare`) is returned as it is."""
    optimized = _optimized_module_type()
    if (optimized and isinstance(model, optimized)) or _compiled_in_place(model) or has_compiled_regions(model):
        return model
    kwargs = dynamo_plugin.to_kwargs()
    if dynamo_plugin.use_regional_compilation:
        if regions_in_place:
            return compile_regions_in_place(model, **kwargs)
        return compile_regions(model, **kwargs)
    return torch.compile(model, **kwargs)


def get_module_children_bottom_up(model: torch.nn.Module, return_fqns: bool = False) -> list:
    """Every submodule of `model`, children before their parent (post-order, in registration order), `model`
    last; with `return_fqns`, `(qualified_name, module)` pairs (`""` for `model`). The order in which regional
    compilation and FSDP wrap blocks: inner blocks first."""
    ordered: list = []
    # an explicit stack, so very deep models do not hit Python's recursion limit
    stack = [("", model, False)]
    while stack:
        name, module, children_done = stack.pop()
        if children_done:
            ordered.append((name, module) if return_fqns else module)
            continue
        stack.append((name, module, True))
        for child_name, child in reversed(list(module.named_children())):
            stack.append((f"{name}.{child_name}" if name else child_name, child, False))
    return ordered
