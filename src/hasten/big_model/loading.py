"""Reading model weights into a model: whole, or placed module by module along a device map.

Also the tensor-level helpers the big-model toolkit shares (`set_module_tensor_to_device`,
`named_module_tensors`, tied parameters). Device maps themselves are computed in `device_map.py` beside this module.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys

import torch

from ..checkpoint import state_dicts
from ..checkpoint.storage import fast_io
from ..core.errors import CheckpointError, NotSupportedYetError, OffloadError
from .bnb_params import is_int8_parameter, is_quantized_parameter, place_quantized_parameter, quantize_int8
from .device_map import _device_of

logger = logging.getLogger(__name__)

_INDEX_NAMES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
_SINGLE_NAMES = ("model.safetensors", "pytorch_model.bin")


def _weight_files(checkpoint: str) -> list:
    """The weight files a checkpoint path stands for: one file, an index JSON, or a folder holding either."""
    checkpoint = os.path.expanduser(str(checkpoint))
    if os.path.isfile(checkpoint):
        if checkpoint.endswith(".json"):
            return _files_from_index(checkpoint)
        return [checkpoint]
    if not os.path.isdir(checkpoint):
        raise CheckpointError(f"load_checkpoint_in_model: {checkpoint} is neither a weights file nor a folder")
    for name in _INDEX_NAMES:
        if os.path.isfile(os.path.join(checkpoint, name)):
            return _files_from_index(os.path.join(checkpoint, name))
    for name in _SINGLE_NAMES:
        if os.path.isfile(os.path.join(checkpoint, name)):
            return [os.path.join(checkpoint, name)]
    indexes = sorted(n for n in os.listdir(checkpoint) if n.endswith(".index.json"))
    if len(indexes) > 1:
        raise CheckpointError(f"load_checkpoint_in_model: {checkpoint} holds several weights indexes {indexes}; pass "
                              "the path of the one to load")
    if indexes:
        return _files_from_index(os.path.join(checkpoint, indexes[0]))
    candidates = [n for n in os.listdir(checkpoint) if n.endswith((".safetensors", ".bin"))]
    if len(candidates) == 1:
        return [os.path.join(checkpoint, candidates[0])]
    raise CheckpointError(
        f"load_checkpoint_in_model: {checkpoint} holds no weights index (*.index.json) and not exactly one "
        f"weights file (found {len(candidates)})"
    )


def _files_from_index(index_path: str) -> list:
    """The files an index names: Hugging Face's `{"weight_map": {name: file}}`, or the bare `{name: file}` map."""
    try:
        with open(index_path) as handle:
            index = json.load(handle)
    except (OSError, ValueError) as error:
        raise CheckpointError(f"{index_path} is not a valid weights index ({error})") from None
    weight_map = index.get("weight_map", index) if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
        raise CheckpointError(f"{index_path} is not a valid weights index: expected {{\"weight_map\": {{name: file}}}} "
                              "or a {name: file} mapping")
    folder = os.path.dirname(index_path)
    return [os.path.join(folder, name) for name in sorted(set(weight_map.values()))]


def _is_safetensors(path: str) -> bool:
    return str(path).endswith(".safetensors")


def _mapped(path: str):
    """The safetensors file mapped in place; its metadata format must be "pt" (as Accelerate checks)."""
    from .offload import mapped_safetensors

    try:
        mapped = mapped_safetensors(path)
    except (OSError, ValueError) as error:
        raise CheckpointError(f"checkpoint file {path} is corrupt or truncated ({error})") from None
    metadata = mapped.metadata
    if metadata is None:
        logger.warning("%s has no metadata; reading it as a PyTorch ('pt') file", path)
    elif metadata.get("format") not in ("pt", "tf", "flax"):
        raise OSError(f"{path} does not say which framework wrote it (metadata format "
                      f"{metadata.get('format')!r}); save it with safetensors.torch or save_model")
    elif metadata["format"] != "pt":
        raise CheckpointError(f"{path} was saved by {metadata['format']}; hasten loads PyTorch ('pt') checkpoints")
    return mapped


def _read(path: str) -> dict:
    """Every tensor of one weights file: views of the memory-mapped file for safetensors (no copy), or
    `torch.load(mmap=True, weights_only=True)` for `.bin` files."""
    if _is_safetensors(path):
        mapped = _mapped(path)
        return {name: mapped.tensor(name) for name in mapped.keys()}
    try:
        return fast_io.load_object(path, {"mmap": True})
    except CheckpointError:
        return fast_io.load_object(path)  # old (non-zip) .bin files cannot be mapped


def load_state_dict(checkpoint_file, device_map=None):
    """The tensors of one weights file, on CPU (views of the mapped file for safetensors), or with a device
    map, each on the device its module is mapped to ("disk" weights stay on CPU)."""
    tensors = _read(str(checkpoint_file))
    if device_map is None or not _is_safetensors(str(checkpoint_file)):
        return tensors
    for name, tensor in tensors.items():
        try:
            device = _device_of(name, device_map)
        except ValueError:
            device = "cpu"
        if device not in ("cpu", "disk"):
            tensors[name] = tensor.to(device)
    return tensors


# -- placing single tensors ------------------------------------------------------------------------------------
def named_module_tensors(module, include_buffers: bool = True, recurse: bool = False,
                         remove_non_persistent: bool = False):
    """(name, tensor) for the parameters, then the buffers (optionally the persistent ones only) of `module`."""
    yield from module.named_parameters(recurse=recurse)
    if include_buffers:
        skipped = get_non_persistent_buffers(module, recurse=recurse) if remove_non_persistent else set()
        for name, buffer in module.named_buffers(recurse=recurse):
            if name not in skipped:
                yield name, buffer


def get_non_persistent_buffers(module, recurse: bool = False, fqns: bool = False):
    names = set(module._non_persistent_buffers_set)
    if recurse:
        for prefix, sub in module.named_modules():
            names |= {f"{prefix}.{b}" for b in sub._non_persistent_buffers_set} if fqns else sub._non_persistent_buffers_set
    return names


def id_tensor_storage(tensor):
    """(device, storage pointer, storage bytes): equal for tensors that share memory."""
    try:
        storage = tensor.untyped_storage()
        return tensor.device, storage.data_ptr(), storage.nbytes()
    except (NotImplementedError, RuntimeError):
        return tensor.device, 0, tensor.nelement() * tensor.element_size()


_NON_CASTING_PREFIXES = ("torch.uint", "torch.int", "torch.bool")


def _owner(module, tensor_name: str):
    for part in tensor_name.split(".")[:-1]:
        child = getattr(module, part, None)
        if child is None:
            raise ValueError(f"{type(module).__name__} has no attribute {part!r} (looking for {tensor_name!r})")
        module = child
    return module, tensor_name.rsplit(".", 1)[-1]


def _torch_device(device):
    if isinstance(device, int):
        return torch.device("cuda", device)
    return torch.device(device)


def set_module_tensor_to_device(module, tensor_name, device, value=None, dtype=None, fp16_statistics=None,
                                tied_params_map=None, non_blocking: bool = False, clear_cache: bool = True):
    """Put parameter or buffer `tensor_name` (dotted) of `module` on `device`, optionally with a new `value`.

    A parameter keeps its class and `requires_grad`. `value` is cast to the current dtype unless `dtype` is
    given (integer and bool values are never cast). `tied_params_map` ({data_ptr: {device: tensor}}) lets tied
    weights share one copy per device.
    """
    owner, name = _owner(module, tensor_name)
    if name not in owner._parameters and name not in owner._buffers:
        raise ValueError(f"{type(owner).__name__} has no parameter or buffer named {name!r}")
    is_buffer = name in owner._buffers
    old = getattr(owner, name)
    if tied_params_map is not None:
        for probe in (value, old):
            if probe is not None and probe.data_ptr() in tied_params_map and device in tied_params_map[probe.data_ptr()]:
                owner._parameters[name] = tied_params_map[probe.data_ptr()][device]
                return
    if old.device.type == "meta" and str(device) != "meta" and value is None:
        raise ValueError(f"{tensor_name} is on the meta device: pass `value` to put it on {device}")
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype.replace("torch.", ""))
    if value is not None:
        if old.shape != value.shape and type(old).__name__ != "Params4bit":
            # Accelerate's exact words (code compares the whole text); ours ride along as a note
            error = ValueError(f'Trying to set a tensor of shape {value.shape} in "{name}" (which has shape '
                               f'{old.shape}), this looks incorrect.')
            if hasattr(error, "add_note"):
                error.add_note(f"cannot set {tensor_name}: the value has shape {tuple(value.shape)}, the model "
                               f"expects {tuple(old.shape)}; the checkpoint does not match this model")
            raise error
    if not is_buffer and is_quantized_parameter(old):
        # bitsandbytes weights are quantized on arrival and carry settings and statistics that a plain
        # Parameter rebuild would drop.
        owner._parameters[name] = place_quantized_parameter(old, value, _torch_device(device), fp16_statistics,
                                                            dtype=dtype)
        return
    if value is not None:
        if dtype is None:
            value = value.to(old.dtype, non_blocking=non_blocking)
        elif not str(value.dtype).startswith(_NON_CASTING_PREFIXES):
            value = value.to(dtype, non_blocking=non_blocking)
    target = device
    with torch.no_grad():
        if value is None:
            new = old.to(target, non_blocking=non_blocking)
            if dtype is not None and str(target) == "meta" and not str(old.dtype).startswith(_NON_CASTING_PREFIXES):
                new = new.to(dtype)
        elif isinstance(value, torch.Tensor):
            new = value.to(target, non_blocking=non_blocking)
        else:
            new = torch.tensor(value, device=target)
        if is_buffer:
            owner._buffers[name] = new
        elif value is not None or _torch_device(target) != owner._parameters[name].device or new.dtype != old.dtype:
            param_cls = type(owner._parameters[name])
            hf_initialized = getattr(old, "_is_hf_initialized", None)
            if param_cls is torch.nn.Parameter or issubclass(param_cls, torch.nn.Parameter):
                try:
                    new = param_cls(new, requires_grad=old.requires_grad)
                except TypeError:  # a Parameter subclass with its own constructor
                    new = torch.nn.Parameter(new, requires_grad=old.requires_grad)
            if hf_initialized is not None:
                new._is_hf_initialized = hf_initialized
            owner._parameters[name] = new
            if fp16_statistics is not None:
                new.SCB = fp16_statistics.to(target, non_blocking=non_blocking)
    if clear_cache and str(target) not in ("cpu", "meta"):
        from ..training.memory import clear_device_cache

        clear_device_cache()
    if tied_params_map is not None:
        for probe in (old, value):
            if probe is not None and probe.data_ptr() in tied_params_map and target not in tied_params_map[probe.data_ptr()]:
                tied_params_map[probe.data_ptr()][target] = new
                break


def retie_parameters(model, tied_params):
    """Make every name of each tied group point at one parameter again (the first that is not on meta)."""
    for group in tied_params:
        owners = [_owner(model, name) for name in group]
        real = next((getattr(m, n) for m, n in owners if getattr(m, n).device.type != "meta"), None)
        if real is None:
            continue
        for owner, name in owners:
            setattr(owner, name, real)


def load_offloaded_weights(model, index, offload_folder):
    """Load every weight listed in an offload `index` from `offload_folder` into `model` on the CPU."""
    from .offload import load_offloaded_weight

    for name, info in (index or {}).items():
        if "SCB" in name:
            continue
        statistics = None
        scb = name.replace("weight", "SCB")
        if "weight" in name and scb in index:
            statistics = load_offloaded_weight(os.path.join(offload_folder, f"{scb}.dat"), index[scb])
        weight = load_offloaded_weight(os.path.join(offload_folder, f"{name}.dat"), info)
        set_module_tensor_to_device(model, name, "cpu", value=weight, fp16_statistics=statistics)


# -- loading a checkpoint --------------------------------------------------------------------------------------
def _load_without_map(model, files, dtype, keep_fp32, strict):
    expected = model.state_dict(keep_vars=True)
    seen, unexpected = set(), []
    for path in files:
        loaded = _read(path)
        chunk = {}
        for name, tensor in loaded.items():
            if name not in expected:
                unexpected.append(name)
                continue
            target = expected[name]
            if dtype is not None and tensor.is_floating_point() and not any(m in name for m in keep_fp32):
                tensor = tensor.to(dtype)
            elif tensor.is_floating_point() and target.is_floating_point() and dtype is None:
                tensor = tensor.to(target.dtype)
            device = "cpu" if target.is_meta else target.device
            chunk[name] = tensor.to(device)
            seen.add(name)
        # assign=True materialises meta parameters (views of the mapped file: no copy); otherwise copy into the
        # existing storage.
        any_meta = any(expected[n].is_meta for n in chunk)
        model.load_state_dict(chunk, strict=False, assign=any_meta)
        del loaded, chunk
    return seen, unexpected


def _keeps_fp32(name, keep_in_fp32_modules) -> bool:
    return any((key in name and key + "." in name) or key == name for key in keep_in_fp32_modules)


def _load_with_map(model, files, device_map, offload_folder, dtype, offload_state_dict, offload_buffers,
                   keep_in_fp32_modules, tied, offload_8bit_bnb=False):
    """Place each tensor where the map says. Disk weights of a safetensors checkpoint stay in its files (the
    offload index points at them); other disk weights are written to `offload_folder` as `.dat` files. With
    `offload_8bit_bnb`, disk weights of 8-bit layers are quantized first and written as int8 plus `SCB` scales."""
    import shutil
    import tempfile

    from .offload import offload_weight, safetensors_offload_entry, save_offload_index

    model_keys = set(model.state_dict())
    buffer_names = {name for name, _ in model.named_buffers()}
    offload_index, staged_index, staging = {}, {}, None
    seen, unexpected = set(), []
    try:
        for path in files:
            loaded = _read(path)
            for name, tensor in loaded.items():
                if "SCB" in name:
                    continue
                if name not in model_keys:
                    unexpected.append(name)
                    continue
                seen.add(name)
                device = _device_of(name, device_map)
                new_dtype = dtype
                if dtype is not None and torch.is_floating_point(tensor):
                    # Accelerate honours keep_in_fp32_modules for fp16 only; bf16 loses the same precision.
                    if keep_in_fp32_modules and _keeps_fp32(name, keep_in_fp32_modules):
                        new_dtype = torch.float32
                elif not torch.is_floating_point(tensor):
                    new_dtype = None
                statistics = None
                scb = name.replace("weight", "SCB")
                if "weight" in name and scb in loaded and tensor.dtype == torch.int8:
                    statistics = loaded[scb]
                if device == "disk" and offload_8bit_bnb and is_int8_parameter(model.get_parameter(name)):
                    int8, scales = (tensor, statistics) if statistics is not None else quantize_int8(tensor)
                    offload_weight(int8, name, offload_folder, index=offload_index)
                    offload_weight(scales, name.replace("weight", "SCB"), offload_folder, index=offload_index)
                    set_module_tensor_to_device(model, name, "meta", dtype=torch.int8)
                elif device == "disk" and (offload_buffers or name not in buffer_names):
                    final_dtype = new_dtype or tensor.dtype
                    set_module_tensor_to_device(model, name, "meta", dtype=final_dtype)
                    if _is_safetensors(path):
                        cast = final_dtype if final_dtype != tensor.dtype else None
                        offload_index[name] = safetensors_offload_entry(path, name, dtype=cast)
                    else:
                        offload_weight(tensor, name, offload_folder, index=offload_index)
                elif device == "cpu" and offload_state_dict and not _is_safetensors(path):
                    # Stage CPU weights on disk while the rest loads, to bound peak RAM (a safetensors file is
                    # already mapped, so it needs no staging).
                    if staging is None:
                        staging = tempfile.mkdtemp(prefix="hasten-offload-")
                    set_module_tensor_to_device(model, name, "meta", dtype=new_dtype or tensor.dtype)
                    offload_weight(tensor, name, staging, index=staged_index)
                else:
                    # Buffers of disk-mapped modules are loaded on the CPU (Accelerate leaves them at their
                    # initial values); the dispatch hook moves them to the execution device.
                    target = "cpu" if device == "disk" else device
                    set_module_tensor_to_device(model, name, target, value=tensor, dtype=new_dtype,
                                                fp16_statistics=statistics)
            del loaded
        _alias_tied_offloads(model, offload_index, device_map, tied)
        if offload_index:
            save_offload_index(offload_index, offload_folder)
        if staging is not None:
            load_offloaded_weights(model, staged_index, staging)
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
    return seen, unexpected


def _alias_tied_offloads(model, offload_index, device_map, tied):
    """A tied weight is stored once; give its other disk-mapped names an index entry pointing at the same bytes
    (and the same dtype), so that each module's hook finds its weight under its own name."""
    for group in tied:
        stored = next((name for name in group if name in offload_index), None)
        if stored is None:
            continue
        dtype = model.get_parameter(stored).dtype
        for name in group:
            if name not in offload_index and _device_of(name, device_map) == "disk":
                offload_index[name] = {**offload_index[stored],
                                       "weight_name": offload_index[stored].get("weight_name", stored)}
                if model.get_parameter(name).dtype != dtype:
                    set_module_tensor_to_device(model, name, "meta", dtype=dtype)


def load_checkpoint_in_model(model: torch.nn.Module, checkpoint, device_map=None, offload_folder=None, dtype=None,
                             offload_state_dict: bool = False, offload_buffers: bool = False,
                             keep_in_fp32_modules=None, offload_8bit_bnb: bool = False, strict: bool = False,
                             full_state_dict: bool = True, broadcast_from_rank0: bool = False) -> None:
    """Load weights (a file, an index JSON, or a folder with shards and an index) into `model`, file by file.

    Without `device_map`, tensors keep each parameter's device (parameters on `meta` are materialised on the
    CPU as views of the memory-mapped file); `dtype` casts floating-point weights. With `device_map`, each
    tensor goes where its module is mapped: a device, "cpu", or "disk" (then `offload_folder` is required).
    Missing and unexpected names are logged, or raise with `strict=True`.
    """
    from .device_map import check_tied_parameters_on_same_device, find_tied_parameters

    if broadcast_from_rank0:
        if device_map is not None or dtype is not None or keep_in_fp32_modules or offload_folder is not None:
            raise NotSupportedYetError("load_checkpoint_in_model: broadcast_from_rank0=True fills a model as it is "
                                       "(one device, its own dtypes), not with device_map/dtype/keep_in_fp32_modules/"
                                       "offload_folder; fix: drop those, or load the checkpoint on every rank")
        _load_broadcast_from_rank0(model, checkpoint, strict, full_state_dict)
        return
    if not full_state_dict:
        # Only read together with broadcast_from_rank0 (a sharded model filled from rank 0's full copy).
        raise NotSupportedYetError("load_checkpoint_in_model: full_state_dict=False (loading sharded pieces from "
                                   "rank 0) is only built with broadcast_from_rank0=True; load the checkpoint on "
                                   "every rank")
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype.replace("torch.", ""))
    keep_fp32 = tuple(keep_in_fp32_modules or ())
    files = _weight_files(checkpoint)
    tied = find_tied_parameters(model)
    # Taken before loading: quantized layers add their statistics (SCB, quant_state) to state_dict() once loaded.
    expected = list(model.state_dict(keep_vars=True))
    if device_map is None:
        if offload_folder is not None or offload_buffers:
            raise OffloadError("load_checkpoint_in_model: offload_folder/offload_buffers need a device_map that "
                               "maps modules to 'disk'; pass device_map=...")
        seen, unexpected = _load_without_map(model, files, dtype, keep_fp32, strict)
    else:
        check_tied_parameters_on_same_device(tied, device_map)
        if "disk" in device_map.values():
            if offload_folder is None:
                disk = [name for name, device in device_map.items() if device == "disk"]
                raise OffloadError(f"load_checkpoint_in_model: the device_map sends {disk[:3]} to 'disk' but no "
                                   "offload_folder was given; pass offload_folder='some/folder'")
            os.makedirs(offload_folder, exist_ok=True)
        seen, unexpected = _load_with_map(model, files, device_map, offload_folder, dtype, offload_state_dict,
                                          offload_buffers, keep_fp32, tied, offload_8bit_bnb)
    # Loading replaced parameter objects; make tied names share one again.
    retie_parameters(model, tied)
    missing = [name for name in expected if name not in seen]
    if missing:
        # Tied weights are stored once; they are filled when their twin is loaded.
        tied_names = {name for group in tied for name in group if any(other in seen for other in group)}
        if device_map is None:
            tied_names |= set(state_dicts.fill_aliases(model, {n: None for n in seen}))
        missing = [n for n in missing if n not in tied_names]
    if strict and (missing or unexpected):
        raise CheckpointError(
            f"load_checkpoint_in_model: missing keys {missing[:5]}{'...' if len(missing) > 5 else ''}, unexpected "
            f"keys {unexpected[:5]}{'...' if len(unexpected) > 5 else ''}"
        )
    if missing:
        logger.warning("load_checkpoint_in_model: %d weight(s) not in the checkpoint: %s", len(missing), missing[:10])
    if unexpected:
        # Accelerate's words first: users' log filters match them
        logger.warning(
            f"Some weights of the model checkpoint at {checkpoint} were not used when initializing "
            f"{type(model).__name__}: {unexpected[:10]}{'...' if len(unexpected) > 10 else ''} ({len(unexpected)} in "
            "all). Check that the checkpoint belongs to this model, or pass strict=True to refuse it."
        )


def _load_broadcast_from_rank0(model, checkpoint, strict: bool, full_state_dict: bool) -> None:
    """Rank 0 reads the checkpoint; torch.distributed.checkpoint's `set_model_state_dict` broadcasts each tensor
    and every rank keeps its part (its shard of an FSDP2/TP parameter, or the whole tensor)."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    if not dist.is_initialized():
        raise NotSupportedYetError("load_checkpoint_in_model: broadcast_from_rank0=True needs the process group of a "
                                   "distributed run (Accelerator(), launched); fix: broadcast_from_rank0=False")
    state = {}
    if dist.get_rank() == 0:
        for path in _weight_files(checkpoint):
            state.update(_read(path))
    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=full_state_dict, strict=strict,
                                                                broadcast_from_rank0=True))


# -- models with offloaded weights -----------------------------------------------------------------------------
def has_offloaded_params(module) -> bool:
    """Whether `module` has an offloading `AlignDevicesHook`."""
    # hooks.py imports this module; a hook can only exist once hooks.py is loaded, so look it up instead of
    # importing it (tests/test_import_cycles.py keeps the package free of cycles).
    hooks = sys.modules.get("hasten.hooks")
    hook = getattr(module, "_hf_hook", None)
    return hooks is not None and isinstance(hook, hooks.AlignDevicesHook) and hook.offload


@contextlib.contextmanager
def align_module_device(module, execution_device=None):
    """Within the block, `module`'s own weights are materialised (offloaded ones) or moved to
    `execution_device`; afterwards they go back."""
    if has_offloaded_params(module):
        hook = module._hf_hook
        saved = hook.execution_device
        if execution_device is not None:
            hook.execution_device = execution_device
        try:
            hook.pre_forward(module)
            yield
        finally:
            hook.post_forward(module, None)
            hook.execution_device = saved
    elif execution_device is not None:
        devices = {name: param.device for name, param in module.named_parameters(recurse=False)}
        try:
            for name in devices:
                set_module_tensor_to_device(module, name, execution_device)
            yield
        finally:
            for name, device in devices.items():
                set_module_tensor_to_device(module, name, device)
    else:
        yield


def get_state_dict_offloaded_model(model):
    """The full state dict of a model with offloaded modules, materialising one offloaded module at a time on the
    CPU. Everything else (the root's own weights included) comes from `model.state_dict()` as it is."""
    state_dict = model.state_dict()
    for name, module in model.named_modules():
        if not has_offloaded_params(module):
            continue
        prefix = f"{name}." if name else ""
        with align_module_device(module, "cpu"):
            for key, value in module.state_dict().items():
                state_dict[prefix + key] = value.to("cpu")
    left = sorted(key for key, value in state_dict.items() if isinstance(value, torch.Tensor) and value.is_meta)
    if left:
        logger.warning("These tensors were not saved because they are still on the meta device: %s", left)
    return state_dict


def get_state_dict_from_offload(module, module_name, state_dict, device_to_put_offload="cpu"):
    root = module_name[: module_name.rfind(".")]
    device = device_to_put_offload if has_offloaded_params(module) else None
    with align_module_device(module, device):
        for key, value in module.state_dict().items():
            if f"{root}.{key}" in state_dict:
                state_dict[f"{root}.{key}"] = value
    return state_dict


def is_peft_model(model) -> bool:
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel)
