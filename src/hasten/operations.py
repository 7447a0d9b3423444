"""Collectives and tensor utilities over nested structures (lists, tuples, namedtuples, mappings).

Every collective is a no-op (or identity) in a single process. With `HASTEN_DEBUG_MODE=1` (or
`ACCELERATE_DEBUG_MODE`), `gather`, `reduce`, `broadcast` and `pad_across_processes` first compare
shapes and dtypes across ranks and raise `DistributedOperationException` naming the rank that differs,
instead of hanging or silently mixing data.
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from dataclasses import dataclass
from functools import wraps
from typing import Any

import torch

from .enums import DistributedType, TORCH_DISTRIBUTED_TYPES
from .errors import DistributedOperationException
from .state import PartialState


@dataclass
class TensorInformation:
    shape: torch.Size
    dtype: torch.dtype


def is_torch_tensor(tensor) -> bool:
    return isinstance(tensor, torch.Tensor)


def is_tensor_information(obj) -> bool:
    return isinstance(obj, TensorInformation)


def is_namedtuple(data) -> bool:
    return isinstance(data, tuple) and hasattr(data, "_asdict") and hasattr(data, "_fields")


def honor_type(obj, generator):
    """Rebuild a list/tuple/namedtuple of `obj`'s own type from `generator`."""
    if is_namedtuple(obj):
        return type(obj)(*list(generator))
    return type(obj)(generator)


def _rebuild_mapping(data: Mapping, items: dict):
    try:
        return type(data)(items)
    except TypeError:  # mappings whose constructor takes something else
        return items


def recursively_apply(func, data, *args, test_type=is_torch_tensor, error_on_other_type=False, **kwargs):
    """Apply `func` to every leaf of `data` that passes `test_type`, keeping containers' types."""
    if isinstance(data, (tuple, list)):
        return honor_type(
            data,
            (
                recursively_apply(func, o, *args, test_type=test_type, error_on_other_type=error_on_other_type, **kwargs)
                for o in data
            ),
        )
    if isinstance(data, Mapping):
        return _rebuild_mapping(
            data,
            {
                k: recursively_apply(func, v, *args, test_type=test_type, error_on_other_type=error_on_other_type, **kwargs)
                for k, v in data.items()
            },
        )
    if test_type(data):
        return func(data, *args, **kwargs)
    if error_on_other_type:
        raise TypeError(
            f"Unsupported type {type(data)} passed to `{getattr(func, '__name__', func)}`: only nested "
            f"lists/tuples/dicts of objects that satisfy `{test_type.__name__}` are allowed."
        )
    return data


def send_to_device(tensor, device, non_blocking: bool = False, skip_keys=None):
    """Move every tensor (anything with `.to`) in a nested structure to `device`."""
    if isinstance(tensor, (tuple, list)):
        return honor_type(tensor, (send_to_device(t, device, non_blocking, skip_keys) for t in tensor))
    if isinstance(tensor, Mapping):
        if isinstance(skip_keys, str):
            skip_keys = [skip_keys]
        skip_keys = skip_keys or []
        return _rebuild_mapping(
            tensor,
            {k: (v if k in skip_keys else send_to_device(v, device, non_blocking, skip_keys)) for k, v in tensor.items()},
        )
    if hasattr(tensor, "to"):
        if isinstance(device, str) and device == "npu":
            device = "npu:0"
        try:
            return tensor.to(device, non_blocking=non_blocking)
        except TypeError:
            return tensor.to(device)
    return tensor


def get_data_structure(data):
    return recursively_apply(lambda t: TensorInformation(shape=t.shape, dtype=t.dtype), data)


def get_shape(data):
    return recursively_apply(lambda t: list(t.shape), data)


def initialize_tensors(data_structure):
    return recursively_apply(lambda info: torch.empty(*info.shape, dtype=info.dtype), data_structure,
                             test_type=is_tensor_information)


def find_batch_size(data) -> int:
    """The first dimension of the first tensor found (depth first)."""
    if isinstance(data, (tuple, list, Mapping)) and len(data) == 0:
        raise ValueError(f"Cannot find the batch size from an empty {type(data).__name__}.")
    if isinstance(data, (tuple, list)):
        return find_batch_size(data[0])
    if isinstance(data, Mapping):
        return find_batch_size(data[next(iter(data))])
    if not isinstance(data, torch.Tensor):
        raise TypeError(f"Can only find the batch size of tensors but got {type(data)}.")
    return data.shape[0]


def ignorant_find_batch_size(data):
    try:
        return find_batch_size(data)
    except (ValueError, TypeError):
        return None


def listify(data):
    def _to_list(t):
        t = t.detach().cpu()
        if t.dtype == torch.bfloat16:
            t = t.to(torch.float32)
        return t.tolist()

    return recursively_apply(_to_list, data)


def find_device(data):
    if isinstance(data, Mapping):
        for v in data.values():
            device = find_device(v)
            if device is not None:
                return device
    elif isinstance(data, (tuple, list)):
        for v in data:
            device = find_device(v)
            if device is not None:
                return device
    elif isinstance(data, torch.Tensor):
        return data.device
    return None


def slice_tensors(data, tensor_slice, process_index=None, num_processes=None):
    return recursively_apply(lambda t: t[tensor_slice], data)


def concatenate(data, dim: int = 0):
    """Concatenate a list of same-structured nested batches along `dim`."""
    if isinstance(data[0], (tuple, list)):
        return honor_type(data[0], (concatenate([d[i] for d in data], dim=dim) for i in range(len(data[0]))))
    if isinstance(data[0], Mapping):
        return _rebuild_mapping(data[0], {k: concatenate([d[k] for d in data], dim=dim) for k in data[0]})
    if not isinstance(data[0], torch.Tensor):
        if len(data) == 1:
            return data[0]
        raise TypeError(f"Can only concatenate tensors but got {type(data[0])}")
    return torch.cat(data, dim=dim)


def convert_to_fp32(tensor):
    """Cast every fp16/bf16 tensor of a nested structure to fp32."""

    def _is_half(t):
        return isinstance(t, torch.Tensor) and t.dtype in (torch.float16, torch.bfloat16)

    if isinstance(tensor, torch.Tensor):  # the usual model output: skip the structure walk
        return tensor.float() if tensor.dtype in (torch.float16, torch.bfloat16) else tensor
    return recursively_apply(lambda t: t.float(), tensor, test_type=_is_half)


class ConvertOutputsToFp32:
    """A forward wrapper that returns fp32 wherever the wrapped forward returned fp16/bf16."""

    def __init__(self, model_forward):
        self.model_forward = model_forward
        wraps(model_forward)(self)

    def __call__(self, *args, **kwargs):
        return convert_to_fp32(self.model_forward(*args, **kwargs))

    def __getstate__(self):
        raise pickle.PicklingError(
            "Cannot pickle a prepared model whose forward casts outputs to fp32: call "
            "`accelerator.unwrap_model(model, keep_fp32_wrapper=False)` first."
        )


def convert_outputs_to_fp32(model_forward):
    return ConvertOutputsToFp32(model_forward)


# -- collectives -----------------------------------------------------------------------------------------

def _distributed(state: PartialState) -> bool:
    return state.distributed_type in TORCH_DISTRIBUTED_TYPES and state.num_processes > 1


def _describe(data) -> list:
    """Flat list of (shape, dtype, device type) for every tensor leaf, comparable across ranks."""
    leaves = []
    recursively_apply(
        lambda t: leaves.append((tuple(t.shape), str(t.dtype).replace("torch.", ""), t.device.type)), data
    )
    return leaves


def _check_same_across_ranks(operation: str, data, compare_shapes: bool = True) -> None:
    """Raise the same DistributedOperationException on every rank when the ranks' inputs disagree.

    The descriptions travel through `all_gather_object`, which works whatever the tensors look like, so
    every rank sees every description and takes the same decision: all raise, or none does.
    """
    import torch.distributed as dist

    state = PartialState()
    described = _describe(data)
    if not compare_shapes:
        described = [(len(shape), dtype, device) for shape, dtype, device in described]
    everyone = [None] * state.num_processes
    dist.all_gather_object(everyone, described)
    reference = everyone[0]
    differing = [rank for rank, desc in enumerate(everyone) if desc != reference]

    def shown(shape):
        return str(list(shape)) if compare_shapes else f"{shape}-d"

    if differing:
        what = "shapes and dtypes" if compare_shapes else "number of dimensions and dtypes"
        listing = "; ".join(
            f"rank {rank}: " + (", ".join(f"{shown(s)} {d} on {dev}" for s, d, dev in desc) or "no tensors")
            for rank, desc in enumerate(everyone)
        )
        raise DistributedOperationException(
            f"`{operation}` got tensors whose {what} differ across processes (rank {differing[0]} differs "
            f"from rank 0): {listing}. Make them match on every rank (e.g. `pad_across_processes` first)."
        )
    wrong_device = sorted({dev for _, _, dev in reference if dev != state.device.type})
    if wrong_device:
        raise DistributedOperationException(
            f"`{operation}` got tensors on {', '.join(wrong_device)} but this run's processes use "
            f"{state.device.type}; move them first with `tensor.to(state.device)` or `send_to_device`."
        )


def _verify(operation: str, compare_shapes: bool = True):
    """Debug-mode guard: compare inputs across ranks before a collective that would hang on a mismatch."""

    def decorator(function):
        @wraps(function)
        def wrapper(data, *args, **kwargs):
            state = PartialState()
            if state.debug and _distributed(state):
                _check_same_across_ranks(operation, data, compare_shapes)
            return function(data, *args, **kwargs)

        return wrapper

    return decorator


def _gather_one(tensor: torch.Tensor) -> torch.Tensor:
    import torch.distributed as dist

    state = PartialState()
    if tensor.ndim == 0:
        tensor = tensor.clone()[None]
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()
    if state.backend is not None and state.backend != "gloo":
        output = torch.empty(
            (state.num_processes * tensor.shape[0],) + tuple(tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device
        )
        dist.all_gather_into_tensor(output, tensor)
        return output
    parts = [torch.empty_like(tensor) for _ in range(state.num_processes)]
    dist.all_gather(parts, tensor)
    return torch.cat(parts, dim=0)


@_verify("gather")
def gather(tensor):
    """All-gather every tensor leaf and concatenate along the first dimension (identity in one process)."""
    if not _distributed(PartialState()):
        return tensor
    return recursively_apply(_gather_one, tensor, error_on_other_type=True)


def gather_object(object: Any):
    """All-gather picklable objects; the per-rank lists are concatenated (identity in one process)."""
    import torch.distributed as dist

    state = PartialState()
    if not _distributed(state):
        return object
    gathered = [None] * state.num_processes
    dist.all_gather_object(gathered, object)
    return [item for per_rank in gathered for item in per_rank]


def _broadcast_one(tensor: torch.Tensor, src: int) -> torch.Tensor:
    import torch.distributed as dist

    dist.broadcast(tensor, src=src)
    return tensor


@_verify("broadcast")
def broadcast(tensor, from_process: int = 0):
    """Broadcast every tensor leaf in place from `from_process`; returns the structure."""
    if not _distributed(PartialState()):
        return tensor
    return recursively_apply(_broadcast_one, tensor, src=from_process, error_on_other_type=True)


def broadcast_object_list(object_list: list, from_process: int = 0) -> list:
    """Broadcast a list of picklable objects in place from `from_process`."""
    import torch.distributed as dist

    if _distributed(PartialState()):
        dist.broadcast_object_list(object_list, src=from_process)
    return object_list


@_verify("reduce")
def reduce(tensor, reduction: str = "mean", scale: float = 1.0):
    """All-reduce every tensor leaf: `sum`, `mean` or `max`. As in Accelerate, `none` (and anything else) sums."""
    import torch.distributed as dist

    state = PartialState()

    def _reduce_one(t):
        out = t.clone()
        if not _distributed(state):
            return out
        dist.all_reduce(out, op=dist.ReduceOp.MAX if reduction == "max" else dist.ReduceOp.SUM)
        if reduction == "mean":
            out /= state.num_processes
        return out

    return recursively_apply(_reduce_one, tensor, error_on_other_type=True)


@_verify("pad_across_processes", compare_shapes=False)
def pad_across_processes(tensor, dim: int = 0, pad_index: int = 0, pad_first: bool = False):
    """Pad every tensor leaf along `dim` to the largest size any process has."""

    def _pad_one(t):
        if getattr(t, "is_nested", False) or dim >= len(t.shape) or dim < -len(t.shape):
            return t
        size = torch.tensor(t.shape, device=t.device)[None]
        sizes = gather(size).cpu()
        max_size = int(sizes[:, dim].max())
        if max_size == t.shape[dim]:
            return t
        new_shape = list(t.shape)
        new_shape[dim] = max_size
        out = t.new_zeros(tuple(new_shape)) + pad_index
        index = [slice(None)] * len(new_shape)
        if pad_first:
            index[dim] = slice(max_size - t.shape[dim], max_size)
        else:
            index[dim] = slice(0, t.shape[dim])
        out[tuple(index)] = t
        return out

    if not _distributed(PartialState()):
        return tensor
    return recursively_apply(_pad_one, tensor, error_on_other_type=True)


def pad_input_tensors(tensor, batch_size: int, num_processes: int, dim: int = 0):
    """Pad the batch dimension with zeros so the batch splits evenly into `num_processes` chunks."""

    def _pad(t):
        remainder = batch_size % num_processes
        if remainder == 0 or dim >= t.ndim:
            return t
        new_shape = list(t.shape)
        new_shape[dim] = batch_size + num_processes - remainder
        out = t.new_zeros(tuple(new_shape))
        index = [slice(None)] * len(new_shape)
        index[dim] = slice(0, t.shape[dim])
        out[tuple(index)] = t
        return out

    return recursively_apply(_pad, tensor)


def copy_tensor_to_devices(tensor=None):
    """Share a tensor that exists on exactly one rank (others pass None) with every rank."""
    state = PartialState()
    if not _distributed(state):
        return tensor
    descriptions = gather_object([None if tensor is None else (tuple(tensor.shape), tensor.dtype)])
    owners = [i for i, d in enumerate(descriptions) if d is not None]
    if len(owners) != 1:
        raise ValueError(f"copy_tensor_to_devices needs the tensor on exactly one rank, got it on ranks {owners}")
    shape, dtype = descriptions[owners[0]]
    if tensor is None:
        tensor = torch.zeros(shape, dtype=dtype, device=state.device)
    return reduce(tensor.to(state.device), reduction="sum")


def split_for_process(inputs, process_index: int, num_processes: int, apply_padding: bool, device=None):
    """This process's contiguous share of `inputs` (see `PartialState.split_between_processes`)."""
    if isinstance(inputs, Mapping):
        lengths = {len(v) for v in inputs.values()}
        if len(lengths) > 1:
            raise ValueError("All values of a dict given to split_between_processes must have the same length.")
        for key in list(inputs):
            inputs[key] = split_for_process(inputs[key], process_index, num_processes, apply_padding, device)
        return inputs
    length = len(inputs)
    per, extra = divmod(length, num_processes)
    start = process_index * per + min(process_index, extra)
    end = start + per + (1 if process_index < extra else 0)
    share = inputs[start:end]
    if not apply_padding:
        return share
    target = per + (1 if extra else 0)
    if isinstance(inputs, torch.Tensor):
        share = share.to(device) if device is not None else share
        if share.shape[0] < target:
            filler = inputs[-1:].to(share.device).expand(target - share.shape[0], *inputs.shape[1:])
            share = torch.cat([share, filler], dim=0)
        return share
    if isinstance(inputs, (list, tuple)) and len(share) < target:
        share = type(share)(list(share) + [inputs[-1]] * (target - len(share)))
    return share


def wait_for_everyone() -> None:
    PartialState().wait_for_everyone()


__all__ = [
    "TensorInformation", "broadcast", "broadcast_object_list", "concatenate", "convert_outputs_to_fp32",
    "convert_to_fp32", "copy_tensor_to_devices", "find_batch_size", "find_device", "gather", "gather_object",
    "get_data_structure", "get_shape", "honor_type", "ignorant_find_batch_size", "initialize_tensors",
    "is_namedtuple", "is_tensor_information", "is_torch_tensor", "listify", "pad_across_processes",
    "pad_input_tensors", "recursively_apply", "reduce", "send_to_device", "slice_tensors", "wait_for_everyone",
    "DistributedOperationException", "DistributedType",
]
