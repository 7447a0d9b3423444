"""Hooks around a module's `forward` that see its keyword arguments, and the ones that move weights.

`add_hook_to_module` keeps the original forward as `module._old_forward` and installs one that runs
`hook.pre_forward` -> original -> `hook.post_forward`; `remove_hook_from_module` puts the original back. The
attribute names (`_hf_hook`, `_old_forward`) are Accelerate's, so models hooked by either library (and
transformers, which looks for them) are understood by both.

`AlignDevicesHook` is the engine of dispatching and offloading: it places a module's weights on its
execution device before its forward, and for offloaded modules, drops them back to `meta` afterwards. When
the offloaded weights come from an `OffloadedWeightsLoader`, each offloaded module's hook asks the loader to
prefetch the next offloaded module's weights while this one runs (see `link_prefetch`).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Mapping

import torch
from torch import nn

from .big_model.loading import get_non_persistent_buffers, named_module_tensors, set_module_tensor_to_device
from .big_model.offload import PrefixedDataset
from .distributed.operations import find_device, send_to_device

# Methods dispatch_model wraps on the model instance; removing hooks removes them too.
_ADDED_ATTRIBUTES = ("to", "cuda", "npu", "xpu", "mlu", "sdaa", "musa")


def _compiler_disable(fn):
    """Keep torch.compile from tracing into a hook. `torch.compiler.disable` imports torch._dynamo (seconds), so
    it is only applied once dynamo is loaded, i.e. when something may be compiling; until then, a plain call."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if "torch._dynamo" not in sys.modules:
            return fn(*args, **kwargs)
        disabled = wrapper.__dict__.get("_disabled")
        if disabled is None:
            disabled = wrapper._disabled = torch.compiler.disable(fn)
        return disabled(*args, **kwargs)

    return wrapper


class ModelHook:
    """Base hook: override `init_hook`, `pre_forward`, `post_forward`, `detach_hook` (all pass through)."""

    no_grad = False

    def init_hook(self, module):
        return module

    def pre_forward(self, module, *args, **kwargs):
        return args, kwargs

    def post_forward(self, module, output):
        return output

    def detach_hook(self, module):
        return module


class SequentialHook(ModelHook):
    """Several hooks run in order at each event."""

    def __init__(self, *hooks):
        self.hooks = hooks

    def init_hook(self, module):
        for hook in self.hooks:
            module = hook.init_hook(module)
        return module

    @_compiler_disable
    def pre_forward(self, module, *args, **kwargs):
        for hook in self.hooks:
            args, kwargs = hook.pre_forward(module, *args, **kwargs)
        return args, kwargs

    @_compiler_disable
    def post_forward(self, module, output):
        for hook in self.hooks:
            output = hook.post_forward(module, output)
        return output

    def detach_hook(self, module):
        for hook in self.hooks:
            module = hook.detach_hook(module)
        return module


def _hooked_forward(module, *args, **kwargs):
    hook = module._hf_hook
    args, kwargs = hook.pre_forward(module, *args, **kwargs)
    if hook.no_grad:
        with torch.no_grad():
            output = module._old_forward(*args, **kwargs)
    else:
        output = module._old_forward(*args, **kwargs)
    return hook.post_forward(module, output)


def add_hook_to_module(module: nn.Module, hook: ModelHook, append: bool = False):
    """Install `hook` on `module` (replacing its hook, or after it with `append=True`); returns the module."""
    if append and getattr(module, "_hf_hook", None) is not None:
        previous = module._hf_hook
        remove_hook_from_module(module)
        hook = SequentialHook(previous, hook)
    if hasattr(module, "_hf_hook") and hasattr(module, "_old_forward"):
        original = module._old_forward
    else:
        original = module.forward
        module._old_forward = original
    module = hook.init_hook(module)
    module._hf_hook = hook
    forward = functools.update_wrapper(functools.partial(_hooked_forward, module), original)
    if "GraphModuleImpl" in str(type(module)):
        type(module).forward = forward  # fx GraphModules call forward through their class
    else:
        module.forward = forward
    return module


def remove_hook_from_module(module: nn.Module, recurse: bool = False):
    """Detach the hook and restore the original `forward` (and `.to`/`.cuda` if dispatch wrapped them)."""
    hook = getattr(module, "_hf_hook", None)
    if hook is not None:
        hook.detach_hook(module)
        del module._hf_hook
    if hasattr(module, "_old_forward"):
        if "GraphModuleImpl" in str(type(module)):
            type(module).forward = module._old_forward
        else:
            module.forward = module._old_forward
        del module._old_forward
    for name in _ADDED_ATTRIBUTES:
        module.__dict__.pop(name, None)
    if recurse:
        for child in module.children():
            remove_hook_from_module(child, recurse)
    return module


def remove_hook_from_submodules(module: nn.Module):
    remove_hook_from_module(module, recurse=True)


class AlignDevicesHook(ModelHook):
    """Runs a module on `execution_device`: its weights are put there (once, or for each forward when
    `offload`, from `weights_map`), its inputs moved there, and with `io_same_device` its outputs moved back
    to where the inputs came from. `place_submodules` covers the whole subtree, not just direct tensors."""

    def __init__(self, execution_device=None, offload: bool = False, io_same_device: bool = False,
                 weights_map=None, offload_buffers: bool = False, place_submodules: bool = False, skip_keys=None,
                 tied_params_map=None):
        self.execution_device = execution_device
        self.offload = offload
        self.io_same_device = io_same_device
        self.weights_map = weights_map
        self.offload_buffers = offload_buffers
        self.place_submodules = place_submodules
        self.skip_keys = skip_keys
        self.input_device = None
        self.param_original_devices = {}
        self.buffer_original_devices = {}
        self.tied_params_names = set()
        self.tied_params_map = tied_params_map
        self.tied_pointers_to_remove = set()
        # (module, hook) of the offloaded module expected to run next; set by link_prefetch.
        self.prefetch_next = None

    def __repr__(self):
        return (f"AlignDevicesHook(execution_device={self.execution_device}, offload={self.offload}, "
                f"io_same_device={self.io_same_device}, offload_buffers={self.offload_buffers}, "
                f"place_submodules={self.place_submodules}, skip_keys={self.skip_keys!r})")

    def _offloaded_names(self, module):
        return [name for name, _ in named_module_tensors(module, include_buffers=self.offload_buffers,
                                                         recurse=self.place_submodules, remove_non_persistent=True)]

    def init_hook(self, module):
        if str(self.execution_device) == "meta":
            self.tied_params_map = None
        if not self.offload and self.execution_device is not None:
            for name, _ in named_module_tensors(module, recurse=self.place_submodules):
                set_module_tensor_to_device(module, name, self.execution_device, tied_params_map=self.tied_params_map)
        elif self.offload:
            self.original_devices = {name: tensor.device
                                     for name, tensor in named_module_tensors(module, recurse=self.place_submodules)}
            if self.weights_map is None:
                self.weights_map = {name: tensor.to("cpu") for name, tensor in named_module_tensors(
                    module, include_buffers=self.offload_buffers, recurse=self.place_submodules)}
            for name in self._offloaded_names(module):
                tensor = _get(module, name)
                if self.tied_params_map is not None and tensor.data_ptr() in self.tied_params_map:
                    self.tied_params_names.add(name)
                set_module_tensor_to_device(module, name, "meta")
            if self.execution_device is not None:
                # Buffers that stay (all of them, or the non-persistent ones) live on the execution device.
                kept = ([name for name, _ in module.named_buffers(recurse=self.place_submodules)]
                        if not self.offload_buffers else
                        list(get_non_persistent_buffers(module, recurse=self.place_submodules)))
                for name in kept:
                    set_module_tensor_to_device(module, name, self.execution_device,
                                                tied_params_map=self.tied_params_map)
        return module

    def _statistics(self, name, value):
        if value is None or value.dtype != torch.int8 or "weight" not in name:
            return None
        scb = name.replace("weight", "SCB")
        return self.weights_map[scb] if scb in self.weights_map else None

    @_compiler_disable
    def pre_forward(self, module, *args, **kwargs):
        if self.io_same_device:
            self.input_device = find_device([args, kwargs])
        if self.offload:
            self.tied_pointers_to_remove = set()
            for name in self._offloaded_names(module):
                value = self.weights_map[name]
                if name in self.tied_params_names and value.data_ptr() not in self.tied_params_map:
                    self.tied_params_map[value.data_ptr()] = {}
                if (self.tied_params_map is not None and value.data_ptr() in self.tied_params_map
                        and self.execution_device not in self.tied_params_map[value.data_ptr()]):
                    self.tied_pointers_to_remove.add((value.data_ptr(), self.execution_device))
                set_module_tensor_to_device(module, name, self.execution_device, value=value,
                                            fp16_statistics=self._statistics(name, value),
                                            tied_params_map=self.tied_params_map)
            self._prefetch_next()
        if self.execution_device is None:
            return args, kwargs
        return (send_to_device(args, self.execution_device),
                send_to_device(kwargs, self.execution_device, skip_keys=self.skip_keys))

    def _prefetch_next(self):
        if self.prefetch_next is None:
            return
        module, hook = self.prefetch_next
        prefetch = getattr(hook.weights_map, "prefetch", None)
        if prefetch is not None:
            prefetch(hook._offloaded_names(module))

    @_compiler_disable
    def post_forward(self, module, output):
        if self.offload:
            for name in self._offloaded_names(module):
                set_module_tensor_to_device(module, name, "meta")
            if type(module).__name__ == "Linear8bitLt":
                # bitsandbytes keeps the int8 weight in the layer's matmul state too; release it with the weight.
                module.state.CB = module.state.SCB = None
            for pointer, device in self.tied_pointers_to_remove:
                self.tied_params_map[pointer].pop(device, None)
            self.tied_pointers_to_remove = set()
        if self.io_same_device and self.input_device is not None:
            output = send_to_device(output, self.input_device, skip_keys=self.skip_keys)
        return output

    def detach_hook(self, module):
        if self.offload:
            for name, device in self.original_devices.items():
                if device != torch.device("meta"):
                    value = self.weights_map.get(name, None)
                    set_module_tensor_to_device(module, name, device, value=value,
                                                fp16_statistics=self._statistics(name, value))
        return module


def _get(module, dotted):
    for part in dotted.split("."):
        module = getattr(module, part)
    return module


def attach_execution_device_hook(module, execution_device, skip_keys=None, preload_module_classes=None,
                                 tied_params_map=None):
    """A non-offloading `AlignDevicesHook` on every submodule that has weights and no hook yet (not below
    modules of `preload_module_classes`)."""
    if not hasattr(module, "_hf_hook") and len(module.state_dict()) > 0:
        add_hook_to_module(module, AlignDevicesHook(execution_device, skip_keys=skip_keys,
                                                    tied_params_map=tied_params_map))
    if preload_module_classes is not None and type(module).__name__ in preload_module_classes:
        return
    for child in module.children():
        attach_execution_device_hook(child, execution_device, skip_keys=skip_keys,
                                     preload_module_classes=preload_module_classes, tied_params_map=tied_params_map)


def attach_align_device_hook(module, execution_device=None, offload: bool = False, weights_map=None,
                             offload_buffers: bool = False, module_name: str = "", skip_keys=None,
                             preload_module_classes=None, tied_params_map=None):
    """An `AlignDevicesHook` (appended) on every module with direct weights; a module of
    `preload_module_classes` gets one hook for its whole subtree when offloading."""
    has_direct = next(iter(named_module_tensors(module)), None) is not None
    whole = offload and preload_module_classes is not None and type(module).__name__ in preload_module_classes
    if has_direct or whole:
        prefixed = None
        if weights_map is not None:
            prefixed = PrefixedDataset(weights_map, f"{module_name}." if module_name else "")
        hook = AlignDevicesHook(execution_device=execution_device, offload=offload, weights_map=prefixed,
                                offload_buffers=offload_buffers, place_submodules=whole, skip_keys=skip_keys,
                                tied_params_map=tied_params_map)
        add_hook_to_module(module, hook, append=True)
    if whole:
        return
    for child_name, child in module.named_children():
        attach_align_device_hook(child, execution_device=execution_device, offload=offload, weights_map=weights_map,
                                 offload_buffers=offload_buffers,
                                 module_name=f"{module_name}.{child_name}" if module_name else child_name,
                                 preload_module_classes=preload_module_classes, skip_keys=skip_keys,
                                 tied_params_map=tied_params_map)


def attach_align_device_hook_on_blocks(module, execution_device=None, offload=False, weights_map=None,
                                       offload_buffers: bool = False, module_name: str = "", skip_keys=None,
                                       preload_module_classes=None, tied_params_map=None):
    """Hooks for a device map: `execution_device` and `offload` are one value for all, or dicts by module
    name. A block kept on its device gets one placing hook; an offloaded block gets per-module offload hooks."""
    if not isinstance(execution_device, Mapping) and not isinstance(offload, dict):
        if not offload:
            add_hook_to_module(module, AlignDevicesHook(execution_device=execution_device, io_same_device=True,
                                                        skip_keys=skip_keys, place_submodules=True,
                                                        tied_params_map=tied_params_map))
        else:
            attach_align_device_hook(module, execution_device=execution_device, offload=True,
                                     weights_map=weights_map, offload_buffers=offload_buffers,
                                     module_name=module_name, skip_keys=skip_keys, tied_params_map=tied_params_map)
        return
    if not isinstance(execution_device, Mapping):
        execution_device = {key: execution_device for key in offload}
    if not isinstance(offload, Mapping):
        offload = {key: offload for key in execution_device}

    is_root = module_name == ""
    if module_name in execution_device and module_name in offload and not offload[module_name]:
        add_hook_to_module(module, AlignDevicesHook(execution_device=execution_device[module_name],
                                                    offload_buffers=offload_buffers, io_same_device=is_root,
                                                    place_submodules=True, skip_keys=skip_keys,
                                                    tied_params_map=tied_params_map))
        attach_execution_device_hook(module, execution_device[module_name], skip_keys=skip_keys,
                                     tied_params_map=tied_params_map)
    elif module_name in execution_device and module_name in offload:
        attach_align_device_hook(module, execution_device=execution_device[module_name], offload=True,
                                 weights_map=weights_map, offload_buffers=offload_buffers, module_name=module_name,
                                 skip_keys=skip_keys, preload_module_classes=preload_module_classes,
                                 tied_params_map=tied_params_map)
        if not hasattr(module, "_hf_hook"):
            add_hook_to_module(module, AlignDevicesHook(execution_device=execution_device[module_name],
                                                        io_same_device=is_root, skip_keys=skip_keys,
                                                        tied_params_map=tied_params_map))
        attach_execution_device_hook(module, execution_device[module_name],
                                     preload_module_classes=preload_module_classes, skip_keys=skip_keys,
                                     tied_params_map=tied_params_map)
    elif is_root:
        add_hook_to_module(module, AlignDevicesHook(execution_device=execution_device.get(""), io_same_device=True,
                                                    skip_keys=skip_keys, tied_params_map=tied_params_map))
    for child_name, child in module.named_children():
        attach_align_device_hook_on_blocks(child, execution_device=execution_device, offload=offload,
                                           weights_map=weights_map, offload_buffers=offload_buffers,
                                           module_name=f"{module_name}.{child_name}" if module_name else child_name,
                                           preload_module_classes=preload_module_classes, skip_keys=skip_keys,
                                           tied_params_map=tied_params_map)


def _offload_hook(module):
    hook = getattr(module, "_hf_hook", None)
    hooks = hook.hooks if isinstance(hook, SequentialHook) else (hook,)
    return next((h for h in hooks if isinstance(h, AlignDevicesHook) and h.offload), None)


def link_prefetch(model: nn.Module) -> int:
    """Chain the offloading hooks of `model` in module order (the order a sequential model runs them), so
    each one prefetches the next one's weights while it runs; the last prefetches the first, for the next
    forward. Returns the number of hooks linked."""
    chain = [(module, hook) for module in model.modules() if (hook := _offload_hook(module)) is not None
             and hasattr(hook.weights_map, "prefetch")]
    for index, (_module, hook) in enumerate(chain):
        hook.prefetch_next = chain[(index + 1) % len(chain)] if len(chain) > 1 else None
    return len(chain)


class CpuOffload(ModelHook):
    """Keeps a whole model on the CPU until its forward, then moves it to `execution_device` and leaves it
    there; before that, offloads the previous model of a pipeline (`prev_module_hook`)."""

    def __init__(self, execution_device=None, prev_module_hook=None):
        from .state import PartialState

        self.prev_module_hook = prev_module_hook
        self.execution_device = execution_device if execution_device is not None else PartialState().default_device

    def init_hook(self, module):
        return module.to("cpu")

    @_compiler_disable
    def pre_forward(self, module, *args, **kwargs):
        previous = self.prev_module_hook
        if isinstance(previous, UserCpuOffloadHook):
            if next(previous.model.parameters()).device != torch.device("cpu"):
                previous.offload()
                from .training.memory import clear_device_cache

                clear_device_cache()
        if next(module.parameters()).device == torch.device(self.execution_device):
            return args, kwargs
        module.to(self.execution_device)
        return send_to_device(args, self.execution_device), send_to_device(kwargs, self.execution_device)


class UserCpuOffloadHook:
    """What `cpu_offload_with_hook` returns: `offload()` sends the model back to the CPU, `remove()` unhooks it."""

    def __init__(self, model, hook):
        self.model = model
        self.hook = hook

    def offload(self):
        self.hook.init_hook(self.model)

    def remove(self):
        remove_hook_from_module(self.model)


class LayerwiseCastingHook(ModelHook):
    """Stores a module's weights in `storage_dtype` and casts them to `compute_dtype` for its forward only."""

    _is_stateful = False

    def __init__(self, storage_dtype: torch.dtype, compute_dtype: torch.dtype, non_blocking: bool) -> None:
        self.storage_dtype = storage_dtype
        self.compute_dtype = compute_dtype
        self.non_blocking = non_blocking

    def init_hook(self, module):
        module.to(dtype=self.storage_dtype, non_blocking=self.non_blocking)
        return module

    @_compiler_disable
    def pre_forward(self, module, *args, **kwargs):
        module.to(dtype=self.compute_dtype, non_blocking=self.non_blocking)
        return args, kwargs

    @_compiler_disable
    def post_forward(self, module, output):
        module.to(dtype=self.storage_dtype, non_blocking=self.non_blocking)
        return output
