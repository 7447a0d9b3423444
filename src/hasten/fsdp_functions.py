"""Accelerate's FSDP helper functions (`accelerate.utils.fsdp_utils`), over hasten's FSDP checkpoint code.

`save_fsdp_model` and friends write the same files `save_state` writes for an FSDP model (a DCP folder
`pytorch_model_fsdp_<i>/` for sharded state dicts, one `pytorch_model_fsdp_<i>.bin` for full ones); they are
collectives, so every process calls them.
"""

from __future__ import annotations

import os

import torch

from .backends import fsdp_checkpoint as checkpoint
from .backends.fsdp_checkpoint import merge_fsdp_weights  # noqa: F401 - published here too
from .errors import NotSupportedYetError

# wrapper names that activation checkpointing and torch.compile insert into parameter names
_WRAPPER_PARTS = ("_checkpoint_wrapped_module.", "_orig_mod.")


def _refuse_adapter_only(adapter_only: bool) -> None:
    if adapter_only:
        raise NotSupportedYetError("adapter_only=True (saving only PEFT adapter weights) is not supported by hasten "
                                   "yet; save the whole model (adapter_only=False)")


def save_fsdp_model(fsdp_plugin, accelerator, model, output_dir, model_index: int = 0, adapter_only: bool = False):
    """Write `model`'s state as the plugin's `state_dict_type` says (sharded: a DCP folder; full: one file)."""
    _refuse_adapter_only(adapter_only)
    os.makedirs(output_dir, exist_ok=True)
    return checkpoint.save_model(model, os.fspath(output_dir), model_index, checkpoint.is_sharded(fsdp_plugin))


def load_fsdp_model(fsdp_plugin, accelerator, model, input_dir, model_index: int = 0, adapter_only: bool = False):
    """Load what `save_fsdp_model` wrote (sharded or full, whichever is there) into the prepared `model`."""
    _refuse_adapter_only(adapter_only)
    checkpoint.load_model(model, os.fspath(input_dir), model_index)


def save_fsdp_optimizer(fsdp_plugin, accelerator, optimizer, model, output_dir, optimizer_index: int = 0):
    os.makedirs(output_dir, exist_ok=True)
    return checkpoint.save_optimizer(model, _plain(optimizer), os.fspath(output_dir), optimizer_index,
                                     checkpoint.is_sharded(fsdp_plugin))


def load_fsdp_optimizer(fsdp_plugin, accelerator, optimizer, model, input_dir, optimizer_index: int = 0,
                        adapter_only: bool = False):
    _refuse_adapter_only(adapter_only)
    checkpoint.load_optimizer(model, _plain(optimizer), os.fspath(input_dir), optimizer_index)


def _plain(optimizer):
    return getattr(optimizer, "optimizer", optimizer)  # an AcceleratedOptimizer's inner torch optimizer


def enable_fsdp_ram_efficient_loading() -> None:
    """Ask model loaders (transformers' `from_pretrained`) to read weights on rank 0 only, under FSDP."""
    os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] = "true"


def disable_fsdp_ram_efficient_loading() -> None:
    os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] = "false"


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
    from .state import PartialState

    return torch.amp.GradScaler(PartialState().device.type, **kwargs)
