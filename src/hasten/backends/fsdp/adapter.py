"""`adapter_only=True` in Accelerate's FSDP helpers: only a PEFT model's adapter weights are written and read.

As in Accelerate, a whole state dict (FULL_STATE_DICT) keeps the model's own key names and only its trainable
parameters (a PEFT model trains its adapters alone); a sharded one (a DCP folder) holds peft's adapter state dict
(`get_peft_model_state_dict`, adapter names left out of the keys). A model that is not a PEFT model is saved and
loaded whole, as in Accelerate.
"""

from __future__ import annotations

import os
import sys

from ...checkpoint.storage import dcp as layer_dcp
from ...checkpoint.storage import durable, fast_io
from ...core.errors import NotSupportedYetError
from . import checkpoint
from ...parallelize.fsdp import state_name

_HINT = "adapter_only=True needs peft: pip install peft"


def is_peft_model(model) -> bool:
    """Whether `model` (a prepared one, or the module inside a wrapper) is a peft `PeftModel`. A PeftModel exists
    only once peft is imported, so peft is looked up, never imported, here."""
    peft = sys.modules.get("peft")
    if peft is None:
        return False
    inner = getattr(model, "module", model)  # FSDP1 / DDP wrappers
    return isinstance(model, peft.PeftModel) or isinstance(inner, peft.PeftModel)


def _peft_functions():
    try:
        from peft import get_peft_model_state_dict, set_peft_model_state_dict
    except ImportError as error:
        raise ImportError(f"{_HINT} ({error})") from None
    return get_peft_model_state_dict, set_peft_model_state_dict


def _peft_model(model):
    return model if not hasattr(model, "module") else model.module


def check_supported(fsdp_plugin, use_dcp: bool) -> None:
    if getattr(fsdp_plugin, "fsdp_version", 2) != 2:
        raise NotSupportedYetError("adapter_only=True is supported with FSDP2 only in hasten; use fsdp_version=2, or "
                                   "adapter_only=False")
    if checkpoint.is_sharded(fsdp_plugin) and not use_dcp:
        raise NotSupportedYetError("adapter_only=True with use_dcp=False is not supported by hasten; use use_dcp=True "
                                   "or adapter_only=False")


def save_adapter(fsdp_plugin, model, output_dir: str, index: int):
    """Write the adapter's weights where `save_fsdp_model` writes the model's; returns the name written (or None)."""
    if checkpoint.is_sharded(fsdp_plugin):
        get_state, _ = _peft_functions()
        peft_model = _peft_model(model)
        name = checkpoint.sharded_name(checkpoint.MODEL_NAME, index)
        state = get_state(peft_model, adapter_name=peft_model.active_adapter)
        layer_dcp.save({"model": state}, os.path.join(output_dir, name))
        return name
    from dataclasses import replace

    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    def trainable(options):
        state = get_model_state_dict(model, options=replace(options, ignore_frozen_params=True))
        # torch leaves out a frozen parameter under its first name only: a tied one (GPT-2's output head shares the
        # frozen embedding) stayed in under its second name, and loading the "adapter" then overwrote the base.
        frozen = {state_name(name) for name, param in model.named_parameters(remove_duplicate=False)
                  if not param.requires_grad}
        return {key: value for key, value in state.items() if key not in frozen}

    name = checkpoint.full_name(checkpoint.MODEL_NAME, index)
    state = checkpoint._gather(trainable, fsdp_plugin.state_dict_config)
    if checkpoint._rank() != 0:
        return None
    durable.save_object(state, os.path.join(output_dir, name))
    return name


def load_adapter(model, input_dir: str, index: int) -> None:
    """Read what `save_adapter` wrote (sharded or whole, whichever is there) into the prepared PEFT model."""
    path, sharded = checkpoint._find(input_dir, checkpoint.MODEL_NAME, index)
    if sharded:
        get_state, set_state = _peft_functions()
        peft_model = _peft_model(model)
        # DCP reads into the tensors it is given: this process's shards of the adapter's parameters.
        state = {"model": get_state(peft_model, adapter_name=peft_model.active_adapter)}
        layer_dcp.load(state, path)
        set_state(peft_model, state["model"], adapter_name=peft_model.active_adapter)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    # The adapter is small: every process reads the file, and the base model's weights stay as they are.
    state = fast_io.load_object(path, {"weights_only": True})
    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True, strict=False))
