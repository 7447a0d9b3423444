"""Models quantized with bitsandbytes: 8-bit (LLM.int8) or 4-bit (NF4/FP4) Linear layers, loaded on the big-model
toolkit, and trained with adapters (QLoRA).

    config = BnbQuantizationConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4")
    with init_empty_weights():
        model = build_model()                          # no memory, no initialisation
    model = load_and_quantize_model(model, config, weights_location="checkpoint/", device_map="auto")

Linear layers are swapped for bitsandbytes layers while the model is empty; each weight is quantized as it is
read from the checkpoint (`set_module_tensor_to_device` hands bitsandbytes parameters to `quantized_params`), and
the model is dispatched along a device map whose sizes count quantized weights at 1 or 1/2 byte. bitsandbytes
(>= 0.49) runs on the CPU, so with no GPU the model is quantized for, and runs on, the CPU.
"""

from __future__ import annotations

import copy
import logging
import os
from typing import Optional, Union

import torch
from torch import nn

from ..big_modeling import dispatch_model, init_empty_weights
from ..config.quantization import BnbQuantizationConfig
from ..core.errors import CheckpointError, ConfigError, DeviceMapError
from .bnb_params import INSTALL_HINT, import_bitsandbytes, place_quantized_parameter, quantize_int8
from .device_map import find_tied_parameters, get_balanced_memory, infer_auto_device_map
from .loading import load_checkpoint_in_model, set_module_tensor_to_device
from .offload import offload_weight

logger = logging.getLogger(__name__)

_STRING_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")
_MIN_VERSION = "0.39.0"  # the first bitsandbytes with 4-bit layers (8-bit came earlier)


def _require_bitsandbytes():
    from ..core.availability import compare_versions

    bnb = import_bitsandbytes()
    if not compare_versions(bnb.__version__, ">=", _MIN_VERSION):
        raise ImportError(f"bitsandbytes {bnb.__version__} is too old for 8/4-bit loading (needs >= {_MIN_VERSION}): "
                          f"{INSTALL_HINT}")
    return bnb


def _default_device():
    """Where a quantized model runs when no device map says: the current GPU (or XPU), else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return torch.device("xpu", torch.xpu.current_device())
    return torch.device("cpu")


def _main_device(device_map) -> str:
    """The device offloaded modules execute on: the first accelerator of the map, else the CPU."""
    on_device = [d for d in (device_map or {}).values() if d not in ("cpu", "disk")]
    return str(on_device[0]) if on_device else "cpu"


def _offloaded(device, main_device: str) -> bool:
    """Whether a module placed on `device` is offloaded (its weights kept off the device it runs on)."""
    return device == "disk" or (device == "cpu" and main_device != "cpu")


def _is_skipped(child_name: str, full_name: str, modules_to_not_convert) -> bool:
    # Accelerate's rule: the layer's own name, its full dotted name, or a listed name followed by "." in it.
    return child_name in modules_to_not_convert or any(
        key == full_name or (key + "." in full_name) for key in modules_to_not_convert)


def _matches(name: str, modules) -> bool:
    return any(key in name for key in modules)


def get_parameter_device(parameter: nn.Module) -> torch.device:
    """The device of the first parameter of a module."""
    return next(parameter.parameters()).device


def replace_with_bnb_layers(model, bnb_quantization_config, modules_to_not_convert=None, current_key_name=None):
    """Swap every `nn.Linear` of `model` (in place) for a frozen bitsandbytes `Linear8bitLt` or `Linear4bit`,
    except those named in `modules_to_not_convert`; returns the model. The new layers hold the old weights
    unquantized: they are quantized when they reach a device."""
    modules_to_not_convert = list(modules_to_not_convert or [])
    prefix = ".".join(current_key_name or [])
    replaced = _replace_linears(model, bnb_quantization_config, modules_to_not_convert, prefix, _require_bitsandbytes())
    if not replaced:
        logger.warning("replace_with_bnb_layers: the model has no nn.Linear layer to quantize (models such as GPT-2 "
                       "use Conv1D); nothing was converted")
    return model


def _replace_linears(module, config, modules_to_not_convert, prefix, bnb) -> int:
    replaced = 0
    for child_name, child in module.named_children():
        full_name = f"{prefix}.{child_name}" if prefix else child_name
        if isinstance(child, nn.Linear) and not _is_skipped(child_name, full_name, modules_to_not_convert):
            setattr(module, child_name, _quantized_linear(child, config, bnb))
            replaced += 1
        elif len(list(child.children())) > 0:
            replaced += _replace_linears(child, config, modules_to_not_convert, full_name, bnb)
    return replaced


def _quantized_linear(linear: nn.Linear, config: BnbQuantizationConfig, bnb) -> nn.Module:
    has_bias = linear.bias is not None
    if config.load_in_8bit:
        layer = bnb.nn.Linear8bitLt(linear.in_features, linear.out_features, has_bias, has_fp16_weights=False,
                                    threshold=config.llm_int8_threshold, device=linear.weight.device)
    else:
        layer = bnb.nn.Linear4bit(linear.in_features, linear.out_features, has_bias, config.bnb_4bit_compute_dtype,
                                  compress_statistics=config.bnb_4bit_use_double_quant,
                                  quant_type=config.bnb_4bit_quant_type, device=linear.weight.device)
    layer.weight.data = linear.weight.data
    if has_bias:
        layer.bias.data = linear.bias.data
    layer.requires_grad_(False)
    layer._register_load_state_dict_pre_hook(_load_quantized_state, with_module=True)
    return layer


def _load_quantized_state(module, state_dict, prefix, *_):
    """Let `load_state_dict` (and so `Accelerator.load_state`) take what the layer's `state_dict()` gave: the
    quantized weight with its statistics (`SCB` for 8-bit, the quant_state entries for 4-bit), which bitsandbytes'
    layers alone refuse (8-bit after a forward, 4-bit always: "unexpected keys")."""
    bnb = import_bitsandbytes()
    key = prefix + "weight"
    if isinstance(module, bnb.nn.Linear4bit):
        statistics = {k[len(key) + 1:]: state_dict.pop(k) for k in list(state_dict) if k.startswith(key + ".")}
        if statistics and key in state_dict:
            device = module.weight.device
            module.weight = bnb.nn.Params4bit.from_prequantized(data=state_dict[key], quantized_stats=statistics,
                                                                requires_grad=False, device=device, module=module)
        return
    scales = state_dict.pop(prefix + "SCB", None)
    state_dict.pop(prefix + "weight_format", None)
    if scales is not None and key in state_dict:
        module.weight = place_quantized_parameter(module.weight, state_dict[key], module.weight.device, scales)
        module.state.CB = module.state.SCB = None  # the next forward takes the new weight


def get_keys_to_not_convert(model) -> list:
    """The modules to keep unquantized by default: the output head (the model's last child) and every module
    holding a tied weight; none for a bare transformers base model without tied weights."""
    tied_names = [name for group in find_tied_parameters(model) for name in group]
    base_prefix = getattr(model, "base_model_prefix", None)
    is_base_model = base_prefix is not None and not hasattr(model, base_prefix)
    if not tied_names and is_base_model:
        return []
    children = [name for name, _ in model.named_children()]
    candidates = tied_names + children[-1:]
    keys = []
    for name in candidates:
        for suffix in (".weight", ".bias"):
            if name.endswith(suffix):
                name = name[: -len(suffix)]
        if name not in keys:
            keys.append(name)
    return keys


def has_4bit_bnb_layers(model) -> bool:
    """Whether `model` holds bitsandbytes 4-bit layers."""
    import sys

    if "bitsandbytes" not in sys.modules:
        return False  # such layers only exist once bitsandbytes is loaded; spare the import
    bnb = import_bitsandbytes()
    return any(isinstance(module, bnb.nn.Linear4bit) for module in model.modules())


def _quantized_module_names(model) -> list:
    bnb = import_bitsandbytes()
    return [name for name, module in model.named_modules() if isinstance(module, (bnb.nn.Linear8bitLt,
                                                                                   bnb.nn.Linear4bit))]


def get_quantized_model_device_map(model, bnb_quantization_config, device_map=None, max_memory=None,
                                   no_split_module_classes=None):
    """The device map of a model whose Linear layers were swapped for bitsandbytes layers.

    None → the whole model on the current GPU, else the CPU. "auto"/"balanced"/"balanced_low_0"/"sequential" →
    computed from `max_memory` with quantized weights at their quantized size. 4-bit layers cannot be offloaded
    (to "disk", or to "cpu" when a GPU runs the model): refused; offloaded 8-bit layers are offloaded as int8.
    """
    config = bnb_quantization_config
    if device_map is None:
        device = _default_device()
        device_map = {"": device.index if device.type == "cuda" else str(device)}
    elif isinstance(device_map, str):
        if device_map not in _STRING_MAPS:
            raise DeviceMapError(f"device_map={device_map!r} is not a known strategy; pass a dict or one of "
                                 f"{', '.join(repr(s) for s in _STRING_MAPS)}")
        special_dtypes = _unquantized_dtypes(model, config)
        if device_map != "sequential":
            max_memory = get_balanced_memory(model, max_memory=max_memory, low_zero=device_map == "balanced_low_0",
                                             no_split_module_classes=no_split_module_classes,
                                             dtype=config.target_dtype, special_dtypes=special_dtypes)
        device_map = infer_auto_device_map(model, max_memory=max_memory, dtype=config.target_dtype,
                                           no_split_module_classes=no_split_module_classes,
                                           special_dtypes=special_dtypes)
    if not isinstance(device_map, dict):
        raise DeviceMapError(f"device_map must be None, a dict of module name -> device, or one of "
                             f"{', '.join(repr(s) for s in _STRING_MAPS)}; got {type(device_map).__name__}")
    main = _main_device(device_map)
    quantized = _quantized_module_names(model)
    offloaded = [key for key, device in device_map.items() if _offloaded(device, main)
                 and any(q == key or not key or q.startswith(key + ".") for q in quantized)]
    if offloaded and config.load_in_4bit:
        places = sorted({str(device_map[key]) for key in offloaded})
        raise DeviceMapError(
            f"load_and_quantize_model: 4-bit layers cannot be offloaded, but the device map puts {offloaded[:3]} on "
            f"{'/'.join(places)} while the model runs on {main}; give {main} more memory (max_memory), or pass a "
            "device_map dict: 4-bit modules it maps to cpu/disk are then kept unquantized in torch_dtype"
        )
    if offloaded:
        logger.info("Modules %s are offloaded; their 8-bit weights are offloaded as int8 with their scales.",
                    offloaded[:5])
    return device_map


def _unquantized_dtypes(model, config) -> dict:
    """Sizes for the device map: tensors outside the quantized weights keep `torch_dtype` (fp32 for kept ones)."""
    bnb = import_bitsandbytes()
    quantized_weights = {f"{name}.weight" for name, module in model.named_modules()
                         if isinstance(module, (bnb.nn.Linear8bitLt, bnb.nn.Linear4bit))}
    keep = list(config.keep_in_fp32_modules or [])
    return {name: torch.float32 if _matches(name, keep) else config.torch_dtype
            for name, tensor in model.named_parameters()
            if name not in quantized_weights and tensor.is_floating_point()}


def _resolved(config: BnbQuantizationConfig, model, device_map) -> BnbQuantizationConfig:
    """A copy of `config` with the module lists this load uses (the caller's config is left as it was, so one
    config can load several models)."""
    skip = list(config.skip_modules) if config.skip_modules is not None else get_keys_to_not_convert(model)
    if config.load_in_4bit and isinstance(device_map, dict) and len(device_map) > 1:
        # 4-bit layers cannot be offloaded: modules a custom map offloads stay unquantized instead.
        main = _main_device(device_map)
        skip += [key for key, device in device_map.items() if _offloaded(device, main) and key not in skip]
    keep = list(config.keep_in_fp32_modules or [])
    resolved = copy.copy(config)  # already validated: no second __post_init__ (and its warnings)
    resolved.skip_modules = skip + [k for k in keep if k not in skip]
    resolved.keep_in_fp32_modules = keep
    return resolved


def load_and_quantize_model(model: torch.nn.Module, bnb_quantization_config: BnbQuantizationConfig,
                            weights_location: Optional[Union[str, os.PathLike]] = None, device_map=None,
                            no_split_module_classes=None, max_memory=None,
                            offload_folder: Optional[Union[str, os.PathLike]] = None,
                            offload_state_dict: bool = False):
    """Quantize `model`'s Linear layers with bitsandbytes (8-bit or 4-bit, see `BnbQuantizationConfig`).

    A model created under `init_empty_weights` is filled from `weights_location` (a weights file, an index JSON,
    or a folder of shards, safetensors or .bin), each weight quantized as it is read, and dispatched along
    `device_map` (a dict, or "auto"/"balanced"/"balanced_low_0"/"sequential" computed from `max_memory`; "disk"
    needs `offload_folder`). A model that already has its weights is quantized and moved to the current GPU, or
    kept on the CPU without one. Modules in `skip_modules` (default: `get_keys_to_not_convert`) stay unquantized
    in `torch_dtype`, those in `keep_in_fp32_modules` in float32.
    """
    config = bnb_quantization_config
    if not isinstance(config, BnbQuantizationConfig):
        raise ConfigError("load_and_quantize_model: bnb_quantization_config must be a BnbQuantizationConfig, got "
                          f"{type(config).__name__}")
    _require_bitsandbytes()
    config = _resolved(config, model, device_map)
    keep = config.keep_in_fp32_modules
    model.is_loaded_in_4bit = config.load_in_4bit  # read by peft and by Accelerator.prepare
    model.is_loaded_in_8bit = config.load_in_8bit

    if get_parameter_device(model).type != "meta":
        logger.warning("load_and_quantize_model got a model with its weights loaded; create it under "
                       "init_empty_weights() and pass weights_location to avoid holding it unquantized first")
        replace_with_bnb_layers(model, config, modules_to_not_convert=config.skip_modules)
        # A tied weight stays in fp32 when any of its names is to be kept in fp32.
        kept = {id(p) for name, p in model.named_parameters(remove_duplicate=False) if _matches(name, keep)}
        for param in model.parameters():
            if id(param) in kept:
                param.data = param.data.to(torch.float32)
            elif param.is_floating_point():
                param.data = param.data.to(config.torch_dtype)
        return model.to(_default_device())  # bitsandbytes quantizes as its parameters move

    if weights_location is None:
        raise CheckpointError("load_and_quantize_model: the model is empty (on the meta device), so it needs "
                              "weights_location: a weights file, an index JSON, or the folder of the checkpoint")
    with init_empty_weights():
        replace_with_bnb_layers(model, config, modules_to_not_convert=config.skip_modules)
    device_map = get_quantized_model_device_map(model, config, device_map, max_memory=max_memory,
                                                no_split_module_classes=no_split_module_classes)
    if offload_state_dict is None and "disk" in device_map.values():
        offload_state_dict = True
    main = _main_device(device_map)
    offload = any(_offloaded(device, main) for device in device_map.values())
    load_checkpoint_in_model(model, weights_location, device_map, dtype=config.torch_dtype,
                             offload_folder=offload_folder, offload_state_dict=offload_state_dict,
                             keep_in_fp32_modules=keep, offload_8bit_bnb=config.load_in_8bit and offload)
    return dispatch_model(model, device_map=device_map, offload_dir=offload_folder)


def quantize_and_offload_8bit(model, param, param_name, new_dtype, offload_folder, offload_index, fp16_statistics):
    """Write the 8-bit weight `param_name` to `offload_folder` as int8 plus its `SCB` row scales (quantizing
    `param` first unless `fp16_statistics` says it already is), and leave the model's copy on the meta device."""
    int8, scales = (param, fp16_statistics) if fp16_statistics is not None else quantize_int8(param)
    offload_weight(int8, param_name, offload_folder, index=offload_index)
    offload_weight(scales, param_name.replace("weight", "SCB"), offload_folder, index=offload_index)
    set_module_tensor_to_device(model, param_name, "meta", dtype=torch.int8)

