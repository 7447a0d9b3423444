"""Accelerate's FSDP helper functions (`accelerate.utils.fsdp_utils`), over hasten's FSDP checkpoint code.

`save_fsdp_model` and friends write the same files `save_state` writes for an FSDP model (a DCP folder
`pytorch_model_fsdp_<i>/` for sharded state dicts, one `pytorch_model_fsdp_<i>.bin` for full ones); they are
collectives, so every process calls them.
"""

from __future__ import annotations

import logging
import os

import torch

from ...checkpoint.storage import paths
from ...config.fsdp import get_module_class_from_name  # noqa: F401 - published here too
from ...core.errors import ConfigError
from ...optimizer import inner_optimizer
from ..base import Backend
from ..unwrap import is_compiled as is_compiled_module
from ...parallelize import checkpointing
from ...parallelize import fsdp as sharding
from . import adapter, checkpoint
from .checkpoint import merge_fsdp_weights  # noqa: F401 - published here too

# This module is Accelerate's `utils.fsdp_utils` (hasten.utils.fsdp_utils is this module object): the FSDP2 path
# looks `is_compiled_module`, `fsdp2_prepare_auto_wrap_policy`, `logger` and torch's `fully_shard` up at call time,
# so a `mock.patch` of those names takes effect, as scripts written for Accelerate expect.
logger = logging.getLogger("hasten.utils.fsdp_utils")

# wrapper names that activation checkpointing and torch.compile insert into parameter names
_WRAPPER_PARTS = ("_checkpoint_wrapped_module.", "_orig_mod.")


def _check_accelerator(accelerator, function: str) -> None:
    # hasten reads ranks from the process state the Accelerator built; the argument is kept for Accelerate's
    # signature, so it must be that Accelerator (or something with its ranks), not a placeholder.
    if not hasattr(accelerator, "process_index"):
        raise TypeError(f"{function}: accelerator must be the run's Accelerator, got {type(accelerator).__name__}; "
                        "fix: pass the Accelerator that prepared the model")


def save_fsdp_model(fsdp_plugin, accelerator, model, output_dir, model_index: int = 0, adapter_only: bool = False,
                    use_dcp: bool = True):
    """Write `model`'s state as the plugin's `state_dict_type` says (sharded: a DCP folder; full: one file).
    `use_dcp=False` (sharded only): each process `torch.save`s its own shards to
    `pytorch_model_fsdp_<i>_rank<r>.bin`, no collective; load those with `load_fsdp_model(use_dcp=False)` on
    the same number of processes."""
    _check_accelerator(accelerator, "save_fsdp_model")
    paths.make_folder(output_dir)
    if adapter_only and adapter.is_peft_model(model):  # Accelerate saves a model that is not PEFT whole
        adapter.check_supported(fsdp_plugin, use_dcp)
        return adapter.save_adapter(fsdp_plugin, model, os.fspath(output_dir), model_index)
    sharded = checkpoint.is_sharded(fsdp_plugin)
    if sharded and not use_dcp:
        return checkpoint.save_model_per_rank(model, os.fspath(output_dir), model_index, fsdp_plugin.state_dict_config)
    return checkpoint.save_model(model, os.fspath(output_dir), model_index, sharded, fsdp_plugin.state_dict_config)


def load_fsdp_model(fsdp_plugin, accelerator, model, input_dir, model_index: int = 0, adapter_only: bool = False,
                    use_dcp: bool = True):
    """Load what `save_fsdp_model` wrote (sharded or full, whichever is there) into the prepared `model`;
    `use_dcp=False` reads the per-rank files `save_fsdp_model(use_dcp=False)` wrote."""
    if adapter_only and adapter.is_peft_model(model):
        adapter.check_supported(fsdp_plugin, use_dcp)
        adapter.load_adapter(model, os.fspath(input_dir), model_index)
        return
    if not use_dcp and checkpoint.is_sharded(fsdp_plugin):
        checkpoint.load_model_per_rank(model, os.fspath(input_dir), model_index)
        return
    checkpoint.load_model(model, os.fspath(input_dir), model_index)


def save_fsdp_optimizer(fsdp_plugin, accelerator, optimizer, model, output_dir, optimizer_index: int = 0):
    paths.make_folder(output_dir)
    return checkpoint.save_optimizer(model, inner_optimizer(optimizer), os.fspath(output_dir), optimizer_index,
                                     checkpoint.is_sharded(fsdp_plugin))


def load_fsdp_optimizer(fsdp_plugin, accelerator, optimizer, model, input_dir, optimizer_index: int = 0,
                        adapter_only: bool = False):
    # adapter_only changes nothing here, as in Accelerate: the optimizer holds the trainable (adapter) state only.
    checkpoint.load_optimizer(model, inner_optimizer(optimizer), os.fspath(input_dir), optimizer_index)


def enable_fsdp_ram_efficient_loading() -> None:
    """Ask model loaders (transformers' `from_pretrained`) to read weights on rank 0 only, under FSDP."""
    os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] = "True"  # Accelerate's spelling


def disable_fsdp_ram_efficient_loading() -> None:
    os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] = "False"


def fsdp2_canonicalize_names(named_params: dict) -> dict:
    """Parameter names without the parts activation checkpointing and `torch.compile` insert, so names match the
    plain model's (keys renamed, values kept)."""
    renamed = {}
    for name, value in named_params.items():
        for part in _WRAPPER_PARTS:
            name = name.replace(part, "")
        renamed[name] = value
    return renamed


def fsdp2_switch_optimizer_parameters(optimizer: torch.optim.Optimizer, mapping: dict) -> None:
    """Point `optimizer`'s param groups at new parameters: `mapping` maps an old parameter's `data_ptr()` to the
    parameter that replaces it (as after FSDP2 shards a model in place). A parameter missing from the mapping is
    an error naming it, not an optimizer that silently trains the old tensors."""
    for group_index, group in enumerate(optimizer.param_groups):
        new_params = []
        for param_index, param in enumerate(group["params"]):
            key = param.data_ptr()
            if key not in mapping:
                raise KeyError(f"optimizer param group {group_index}, parameter {param_index} (shape "
                               f"{tuple(param.shape)}) has no replacement in the mapping; was the optimizer "
                               "created from this model's parameters?")
            new_params.append(mapping[key])
        group["params"] = new_params


def get_fsdp2_grad_scaler(**kwargs):
    """A gradient scaler for FSDP2 (plain `torch.amp.GradScaler` on this process's device: FSDP2's gradients are
    DTensors, which it handles)."""
    from ...state import PartialState

    return torch.amp.GradScaler(PartialState().device.type, **kwargs)


def _fsdp2_backend(accelerator, what: str):
    """The FSDP2 backend behind `accelerator`, or a one-line refusal."""
    backend = getattr(accelerator, "_backend", None)
    if not (isinstance(backend, Backend) and hasattr(backend, "prepare_fsdp2_model")
            and getattr(backend, "version", None) == 2):
        raise ConfigError(f"{what} needs an Accelerator set up for FSDP2 (distributed_type FSDP, fsdp_version=2); "
                          "pass fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2) or launch with "
                          "--use_fsdp --fsdp_version 2")
    return backend


def fsdp2_prepare_model(accelerator, model: torch.nn.Module) -> torch.nn.Module:
    """Shard `model` in place with FSDP2 as `accelerator`'s plugin says (wrap policy, mixed precision, offload,
    activation checkpointing, rank-0 RAM-efficient loading) and return it; an already sharded model comes back
    as is. Optimizers built earlier still hold the old parameters: pass them to `prepare` (which re-points
    them), or use `fsdp2_switch_optimizer_parameters`.

    With a hasten Accelerator set up for FSDP2 its backend shards (and remembers the model for `prepare`); with
    anything else that has Accelerate's attributes (`state.fsdp_plugin`, `mixed_precision`, `torch_device_mesh`,
    `is_main_process`) the model is sharded here, as Accelerate does."""
    from torch.distributed.fsdp import FSDPModule

    if isinstance(model, FSDPModule) or (is_compiled_module(model) and isinstance(model._orig_mod, FSDPModule)):
        return model
    if isinstance(getattr(accelerator, "_backend", None), Backend):  # a hasten Accelerator: its backend shards,
        # with this module's policy and upcast (looked up now: a script's patch of them takes effect)
        backend = _fsdp2_backend(accelerator, "fsdp2_prepare_model")
        return backend.prepare_fsdp2_model(model, wrap_policy=fsdp2_prepare_auto_wrap_policy, upcast=upcast_for_fsdp2)
    plugin = accelerator.state.fsdp_plugin
    fsdp_kwargs = sharding.shard_kwargs(plugin, getattr(accelerator, "torch_device_mesh", None))
    ignored = get_parameters_from_modules(plugin.ignored_modules, model, accelerator.device)
    if ignored:
        fsdp_kwargs["ignored_params"] = ignored
    upcast_for_fsdp2(model, accelerator.mixed_precision, accelerator.is_main_process)
    shard_fsdp2_units(model, plugin, fsdp_kwargs)
    return model


def prepare_fsdp2_objects(accelerator, args, prepare_model, canonicalize_names) -> tuple:
    """`Accelerator._prepare_fsdp2`'s work: each model among `args` not sharded yet goes through `prepare_model`
    (Accelerate's `fsdp2_prepare_model`), and the parameter names before and after must agree
    (`canonicalize_names`, read through `accelerator._get_named_parameters` so a patch of it takes effect)."""
    from torch.distributed.fsdp import FSDPModule

    result = list(args)
    models = [i for i, obj in enumerate(result) if isinstance(obj, torch.nn.Module) and not
              isinstance(getattr(obj, "_orig_mod", obj), FSDPModule) and not getattr(obj, "_is_accelerate_prepared", False)]
    if not models:  # nothing left to shard (prepared before: returned as it is)
        return tuple(result)
    before = canonicalize_names(accelerator._get_named_parameters(*result))
    for i in models:
        accelerator.state.fsdp_plugin.set_auto_wrap_policy(result[i])
        result[i] = prepare_model(accelerator, result[i])
    check_fsdp2_names(before, canonicalize_names(accelerator._get_named_parameters(*result)))
    return tuple(result)


def named_parameters_of(objects, drop_refs: bool = False) -> dict:
    """{name: parameter} over the models among `objects` (unwrapped); with `drop_refs` the address of each
    parameter's local data (a DTensor's own shard) instead of the parameter."""
    from ..unwrap import unwrap_model

    named = {}
    for obj in objects:
        if isinstance(obj, torch.nn.Module):
            for name, param in unwrap_model(obj).named_parameters():
                local = getattr(param, "_local_tensor", param)
                named[name] = local.data_ptr() if drop_refs else param
    return named


def check_fsdp2_names(before: dict, after: dict) -> None:
    """Every parameter name from before sharding is still there after it (both canonical), else Accelerate's
    error: a ValueError for the usual tied-embedding names (the model's config ties weights its checkpoint keeps
    apart), a KeyError otherwise."""
    missing = [name for name in before if name not in after]
    if any(name in missing for name in ("lm_head.weight", "model.embed_tokens.weight", "transformer.wte.weight")):
        raise ValueError(f"FSDP2 mapping failed (missing: {missing}). This is likely due to tied embeddings (config "
                         "has tie_word_embeddings=True but checkpoint has separate weights). To fix, try: Set "
                         "`model.config.tie_word_embeddings = False` after loading the model.")
    if missing:
        raise KeyError(f"Parameters missing after FSDP2 wrapping: {missing}")


def upcast_for_fsdp2(model: torch.nn.Module, mixed_precision: str, is_main_process: bool = True) -> None:
    """fp32 master weights under mixed precision, as Accelerate (see `sharding.upcast_for_fsdp2`), logged on this
    module's `logger`."""
    sharding.upcast_for_fsdp2(model, mixed_precision, is_main_process, log=logger)


def shard_fsdp2_units(model: torch.nn.Module, plugin, fsdp_kwargs: dict) -> None:
    """`fully_shard` each block `fsdp2_prepare_auto_wrap_policy` picks, then the root (see `sharding.shard_units`)."""
    sharding.shard_units(model, fsdp_kwargs, fsdp2_prepare_auto_wrap_policy(plugin, model))


def fsdp2_load_full_state_dict(accelerator, model: torch.nn.Module, full_sd: dict, cpu_offload: bool = False):
    """Load a whole state dict that only rank 0 needs to hold (`{}` elsewhere) into the FSDP2-sharded `model`:
    rank 0 broadcasts tensor by tensor and each process keeps its shard. Collective: every process calls it."""
    from ...state import PartialState
    sharding.load_full_state_dict(model, full_sd, PartialState().device, cpu_offload=cpu_offload)


def fsdp2_apply_ac(accelerator, model: torch.nn.Module) -> torch.nn.Module:
    """Activation checkpointing on the blocks `accelerator`'s FSDP plugin wraps (its auto_wrap_policy), as
    Accelerate applies it: each block goes inside torch's `CheckpointWrapper`, so parameter names gain
    `_checkpoint_wrapped_module.` (state_dict keys do not). Call it before sharding; returns `model`."""
    plugin = _fsdp2_backend(accelerator, "fsdp2_apply_ac").plugin
    return checkpointing.checkpoint_wrap_blocks(model, plugin.wrap_predicate(model),
                                                offload=plugin.activation_checkpointing_offload)


def ensure_weights_retied(param_init_fn, model: torch.nn.Module, device: torch.device):
    """Wrap FSDP1's `param_init_fn` so that weights tied in `model` (its `_tied_weights_keys`, as transformers
    declares them) are still one parameter after initialisation re-allocated them module by module.
    Without tied keys, `param_init_fn` comes back unchanged."""
    tied_keys = getattr(model, "_tied_weights_keys", None)
    if not tied_keys:
        return param_init_fn
    if isinstance(tied_keys, dict):  # newer transformers: {target: source}
        tied_keys = list(tied_keys)
    # id of a tied parameter before init -> the parameter every module holding it should share after init
    shared: dict = {id(model.get_parameter(key)): None for key in tied_keys}

    def init_keeping_ties(module: torch.nn.Module):
        holders = [(name, id(param)) for name, param in module.named_parameters(recurse=False) if id(param) in shared]
        module = param_init_fn(module)
        for name, old_id in holders:
            if shared[old_id] is None:
                shared[old_id] = getattr(module, name)
            else:
                setattr(module, name, shared[old_id])
        return module

    return init_keeping_ties


def get_parameters_from_modules(modules, model: torch.nn.Module, device) -> set:
    """The parameters of `modules`: modules, or a regular expression every matching module's full name in `model`
    must match as a whole (as `ignored_modules` is read). Modules picked by the expression are moved to `device`
    first, so the parameters returned are the ones that stay there; None gives an empty set. (trl builds the
    `ignored_params` of its reference models with it.)"""
    if modules is None:
        return set()
    if isinstance(modules, str):
        import re

        pattern = re.compile(modules)
        modules = [submodule.to(device) for name, submodule in model.named_modules() if pattern.fullmatch(name)]
    return {parameter for submodule in modules for parameter in submodule.parameters()}


def fsdp2_prepare_auto_wrap_policy(fsdp2_plugin, model: torch.nn.Module):
    """`module -> bool`, whether `module` gets its own FSDP2 unit under the plugin's `auto_wrap_policy`, or None
    when only the root is sharded (no policy, or a size policy with `min_num_params` 0)."""
    return fsdp2_plugin.wrap_predicate(model)
