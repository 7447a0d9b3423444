"""Models larger than one device: create them without memory, split them over GPUs, CPU and disk, run them.

The usual path (see docs/big_models.md):

    with init_empty_weights():
        model = build_model()                       # parameters on `meta`: no memory, no init time
    model = load_checkpoint_and_dispatch(model, "checkpoint/", device_map="auto", offload_folder="offload")

`load_checkpoint_and_dispatch` computes a device map (`big_model/device_map.py`), loads each weight straight to its
device (`big_model/loading.py`) and attaches the hooks that run each module on its device (`hooks.py`). Weights mapped
to "disk" from a safetensors checkpoint are read in place from its files; the next offloaded block is
prefetched while the current one runs.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re

import torch
from torch import nn

from .big_model.device_map import check_device_map, find_tied_parameters, get_balanced_memory, infer_auto_device_map
from .big_model.loading import load_checkpoint_in_model, retie_parameters
from .big_model.offload import INDEX_NAME, OffloadedWeightsLoader, extract_submodules_state_dict, offload_state_dict
from .core.errors import DeviceMapError, OffloadError
from .distributed.sequence_parallel import _refuse_recurrent_layers_under_sequence_parallelism  # noqa: F401 (Accelerate's path)
from .hooks import (
    AlignDevicesHook,
    CpuOffload,
    LayerwiseCastingHook,
    UserCpuOffloadHook,
    add_hook_to_module,
    attach_align_device_hook,
    attach_align_device_hook_on_blocks,
    link_prefetch,
)

logger = logging.getLogger(__name__)

# Layers whose weights layerwise casting stores in a low-precision dtype.
SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING = (
    nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d, nn.Linear,
)
_STRING_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")


def _include_buffers_default(include_buffers):
    if include_buffers is not None:
        return include_buffers
    from .core.env import env_flag

    return env_flag("INIT_INCLUDE_BUFFERS", False)


@contextlib.contextmanager
def init_empty_weights(include_buffers: bool | None = None):
    """Within the block, new modules get their parameters (and buffers, with `include_buffers`) on the `meta`
    device: no memory, no initialisation. Default for `include_buffers`: HASTEN_/ACCELERATE_INIT_INCLUDE_BUFFERS."""
    with init_on_device(torch.device("meta"), include_buffers=_include_buffers_default(include_buffers)) as handle:
        yield handle


@contextlib.contextmanager
def init_on_device(device, include_buffers: bool | None = None):
    """Within the block, parameters registered by new modules are created on `device`. With
    `include_buffers`, everything created in the block (buffers and plain tensors too) goes there."""
    if _include_buffers_default(include_buffers):
        with torch.device(device):
            yield
        return
    register_parameter = nn.Module.register_parameter

    def register_on_device(module, name, param):
        register_parameter(module, name, param)
        if param is None:
            return
        registered = module._parameters[name]
        if registered.device == torch.device(device):
            return  # already there (e.g. `head.weight = embed.weight`): keep the object, and so the tie
        extra = dict(registered.__dict__)
        hf_initialized = extra.pop("_is_hf_initialized", None)
        extra["requires_grad"] = param.requires_grad
        moved = type(registered)(registered.to(device), **extra)
        if hf_initialized is not None:
            moved._is_hf_initialized = hf_initialized
        module._parameters[name] = moved

    nn.Module.register_parameter = register_on_device
    try:
        yield
    finally:
        nn.Module.register_parameter = register_parameter


def _first_device(model):
    return next(iter(model.parameters())).device


def cpu_offload(model: nn.Module, execution_device=None, offload_buffers: bool = False, state_dict=None,
                preload_module_classes=None):
    """Keep the weights on the CPU (`state_dict`, or a CPU copy of the model's) and bring each module's
    weights to `execution_device` only for its forward."""
    if execution_device is None:
        execution_device = _first_device(model)
    if state_dict is None:
        state_dict = {name: tensor.to("cpu") for name, tensor in model.state_dict().items()}
    add_hook_to_module(model, AlignDevicesHook(io_same_device=True), append=True)
    attach_align_device_hook(model, execution_device=execution_device, offload=True, offload_buffers=offload_buffers,
                             weights_map=state_dict, preload_module_classes=preload_module_classes)
    return model


def cpu_offload_with_hook(model: nn.Module, execution_device=None, prev_module_hook=None):
    """Move the whole model to the CPU now and to `execution_device` at its first forward, where it stays until
    `hook.offload()`. Chain models of a pipeline with `prev_module_hook`: running this model offloads that one."""
    hook = CpuOffload(execution_device=execution_device, prev_module_hook=prev_module_hook)
    add_hook_to_module(model, hook, append=True)
    return model, UserCpuOffloadHook(model, hook)


def disk_offload(model: nn.Module, offload_dir, execution_device=None, offload_buffers: bool = False,
                 preload_module_classes=None):
    """Write the weights to `offload_dir` (unless it already holds an offload index) and read each module's
    weights from there only for its forward."""
    if offload_dir is None:
        raise OffloadError("disk_offload needs an offload_dir: pass disk_offload(model, offload_dir='some/folder')")
    if not os.path.isfile(os.path.join(offload_dir, INDEX_NAME)):
        offload_state_dict(offload_dir, model.state_dict())
    if execution_device is None:
        execution_device = _first_device(model)
    weights_map = OffloadedWeightsLoader(save_folder=offload_dir)
    add_hook_to_module(model, AlignDevicesHook(io_same_device=True), append=True)
    attach_align_device_hook(model, execution_device=execution_device, offload=True, offload_buffers=offload_buffers,
                             weights_map=weights_map, preload_module_classes=preload_module_classes)
    link_prefetch(model)
    return model


def _device_name(device):
    return device if isinstance(device, (int, str)) else str(device)


def _guard_moves(model):
    """Wrap `model.to`/`model.cuda`: moving a dispatched model warns, and is refused while weights are offloaded."""

    def guarded(method):
        @functools.wraps(method)
        def wrapper(*args, **kwargs):
            moving = True
            if method.__name__ == "to":
                moving = torch._C._nn._parse_to(*args, **kwargs)[0] is not None
            if moving:
                logger.warning("You shouldn't move a model that is dispatched with a device map (its hooks place "
                               "the weights).")
                if any(p.device.type == "meta" for p in model.parameters()):
                    raise RuntimeError("You can't move a model that has some modules offloaded to cpu or disk; "
                                       "dispatch it again with another device_map instead.")
            return method(*args, **kwargs)

        return wrapper

    model.to = guarded(model.to)
    model.cuda = guarded(model.cuda)


def dispatch_model(model: nn.Module, device_map, main_device=None, state_dict=None, offload_dir=None,
                   offload_index=None, offload_buffers: bool = False, skip_keys=None, preload_module_classes=None,
                   force_hooks: bool = False):
    """Place each module where `device_map` says and attach the hooks that run it there: modules on "cpu"
    (when a GPU is the main device) or "disk" get their weights for their forward only."""
    check_device_map(model, device_map)
    devices = set(device_map.values())
    if len(devices) > 1 or "disk" in devices or force_hooks:
        if main_device is None:
            # Accelerate takes the first of a set: for GPU indices, the lowest.
            on_device = list({d for d in device_map.values() if d not in ("cpu", "disk")})
            main_device = on_device[0] if on_device else "cpu"
        if main_device != "cpu":
            cpu_modules = [name for name, device in device_map.items() if device == "cpu"]
            if state_dict is None and cpu_modules:
                state_dict = extract_submodules_state_dict(model.state_dict(), cpu_modules)
        disk_modules = [name for name, device in device_map.items() if device == "disk"]
        if disk_modules and offload_dir is None and offload_index is None:
            raise OffloadError(f"dispatch_model: the device_map sends {disk_modules[:3]} to 'disk' but no "
                               "offload_dir was given; pass offload_dir='some/folder'")
        if disk_modules and offload_index is None and not os.path.isfile(os.path.join(offload_dir, INDEX_NAME)):
            offload_state_dict(offload_dir, extract_submodules_state_dict(model.state_dict(), disk_modules))
        execution_device = {name: main_device if device in ("cpu", "disk") else device
                            for name, device in device_map.items()}
        execution_device[""] = main_device
        offloaded = ("disk",) if main_device in ("cpu", "mps") else ("cpu", "disk")
        offload = {name: device in offloaded for name, device in device_map.items()}
        save_folder = offload_dir if disk_modules else None
        weights_map = None
        if state_dict is not None or save_folder is not None or offload_index is not None:
            weights_map = OffloadedWeightsLoader(state_dict=state_dict, save_folder=save_folder, index=offload_index,
                                                 device=main_device if offload_index is not None else None)
        tied_params = find_tied_parameters(model)
        # One copy of each tied weight per device: hooks share it through its data pointer.
        tied_params_map = {}
        for group in tied_params:
            for name in group:
                tensor = model.get_parameter(name)
                if tensor.device.type != "meta":
                    tied_params_map[tensor.data_ptr()] = {}
        attach_align_device_hook_on_blocks(model, execution_device=execution_device, offload=offload,
                                           offload_buffers=offload_buffers, weights_map=weights_map,
                                           skip_keys=skip_keys, preload_module_classes=preload_module_classes,
                                           tied_params_map=tied_params_map)
        link_prefetch(model)
        offloaded_to = sorted(d for d in devices if d in ("cpu", "disk"))
        if offloaded_to:
            logger.info("Some parameters are on the meta device because they were offloaded to the %s.",
                        " and ".join(offloaded_to))
        retie_parameters(model, tied_params)
        _guard_moves(model)
    else:
        device = next(iter(devices))
        if any(p.device.type == "meta" for p in model.parameters()):
            raise DeviceMapError("dispatch_model: some weights are still on the meta device; load them first "
                                 "(load_checkpoint_and_dispatch, or load_checkpoint_in_model)")
        model.to(device)
    model.hf_device_map = dict(device_map)
    return model


def load_checkpoint_and_dispatch(model: nn.Module, checkpoint, device_map=None, max_memory=None,
                                 no_split_module_classes=None, offload_folder=None, offload_buffers: bool = False,
                                 dtype=None, offload_state_dict=None, skip_keys=None, preload_module_classes=None,
                                 force_hooks: bool = False, strict: bool = False, full_state_dict: bool = True,
                                 broadcast_from_rank0: bool = False):
    """Load a checkpoint (a file, an index, or a folder of shards) into a model, usually created under
    `init_empty_weights`, and dispatch it. `device_map` is a dict or "auto"/"balanced"/"balanced_low_0"/
    "sequential" (computed from `max_memory`)."""
    if isinstance(device_map, str):
        if device_map not in _STRING_MAPS:
            raise DeviceMapError(f"device_map={device_map!r} is not a known strategy; pass a dict or one of "
                                 f"{', '.join(repr(s) for s in _STRING_MAPS)}")
        if device_map != "sequential":
            max_memory = get_balanced_memory(model, max_memory=max_memory,
                                             no_split_module_classes=no_split_module_classes, dtype=dtype,
                                             low_zero=device_map == "balanced_low_0")
        device_map = infer_auto_device_map(model, max_memory=max_memory,
                                           no_split_module_classes=no_split_module_classes, dtype=dtype,
                                           offload_buffers=offload_buffers)
        if "disk" in device_map.values() and offload_folder is None:
            _refuse_disk_without_folder(model, device_map, max_memory, no_split_module_classes, dtype)
    if offload_state_dict is None and device_map is not None and "disk" in device_map.values():
        offload_state_dict = True
    load_checkpoint_in_model(model, checkpoint, device_map=device_map, offload_folder=offload_folder, dtype=dtype,
                             offload_state_dict=offload_state_dict, offload_buffers=offload_buffers, strict=strict,
                             full_state_dict=full_state_dict, broadcast_from_rank0=broadcast_from_rank0)
    if device_map is None:
        return model
    return dispatch_model(model, device_map=device_map, offload_dir=offload_folder, offload_buffers=offload_buffers,
                          skip_keys=skip_keys, preload_module_classes=preload_module_classes,
                          force_hooks=force_hooks)


def _refuse_disk_without_folder(model, device_map, max_memory, no_split_module_classes, dtype):
    """The computed map needs the disk but there is no folder: say which budget was too small and both fixes."""
    from .big_model.device_map import _top_level_items, compute_module_sizes, get_max_layer_size, get_max_memory

    sizes = compute_module_sizes(model, dtype=dtype)
    largest, names = get_max_layer_size(_top_level_items(model), sizes,
                                        [] if no_split_module_classes is None else list(no_split_module_classes))
    budgets = {k: v for k, v in get_max_memory(max_memory).items() if k != "disk"}
    on_disk = [name for name, device in device_map.items() if device == "disk"]
    raise OffloadError(
        f"the memory budget {budgets} is too small for the model ({sizes['']} bytes; largest layer {names[:1]} "
        f"{largest} bytes, which the first device keeps free), so {on_disk[:3]} would go to 'disk'; raise "
        "max_memory or pass offload_folder='some/folder'"
    )


def attach_layerwise_casting_hooks(module: nn.Module, storage_dtype: torch.dtype, compute_dtype: torch.dtype,
                                   skip_modules_pattern=None, skip_modules_classes=None, non_blocking: bool = False):
    """Store the weights of Linear/Conv layers in `storage_dtype` (e.g. float8) and compute in `compute_dtype`,
    skipping layers whose dotted name matches `skip_modules_pattern` or whose class is in `skip_modules_classes`."""
    if isinstance(skip_modules_pattern, str):
        skip_modules_pattern = (skip_modules_pattern,)
    _attach_layerwise_casting(module, storage_dtype, compute_dtype, skip_modules_pattern, skip_modules_classes,
                              non_blocking, "")


def _attach_layerwise_casting(module, storage_dtype, compute_dtype, patterns, classes, non_blocking, prefix):
    if (classes is not None and isinstance(module, classes)) or (
            patterns is not None and any(re.search(p, prefix) for p in patterns)):
        return
    if isinstance(module, SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING):
        add_hook_to_module(module, LayerwiseCastingHook(storage_dtype=storage_dtype, compute_dtype=compute_dtype,
                                                        non_blocking=non_blocking), append=True)
        return
    for name, child in module.named_children():
        _attach_layerwise_casting(child, storage_dtype, compute_dtype, patterns, classes, non_blocking,
                                  f"{prefix}.{name}" if prefix else name)
