"""Collectives over nested structures of tensors (lists, tuples, namedtuples, mappings).

The pure helpers over the same structures (`recursively_apply`, `send_to_device`, ...) live in `core/nested.py`
and are re-exported here, where Accelerate users import them from.

Every collective is a no-op (or identity) in a single process. With `HASTEN_DEBUG_MODE=1` (or
`ACCELERATE_DEBUG_MODE`), `gather`, `reduce`, `broadcast` and `pad_across_processes` first compare
shapes and dtypes across ranks and raise `DistributedOperationException` naming the rank that differs,
instead of hanging or silently mixing data.
"""

from __future__ import annotations

import warnings
import zlib
from collections.abc import Mapping
from functools import wraps
from typing import Any

import torch

from ..core.enums import TORCH_DISTRIBUTED_TYPES, DistributedType
from ..core.errors import DistributedOperationException
from ..core.nested import (  # noqa: F401 - re-exported: Accelerate keeps these in its operations module
    ConvertOutputsToFp32,
    TensorInformation,
    concatenate,
    convert_outputs_to_fp32,
    convert_to_fp32,
    find_batch_size,
    find_device,
    get_data_structure,
    get_shape,
    honor_type,
    ignorant_find_batch_size,
    initialize_tensors,
    is_namedtuple,
    is_tensor_information,
    is_torch_tensor,
    listify,
    pad_input_tensors,
    recursively_apply,
    send_to_device,
    slice_tensors,
    split_for_process,
)
from ..state import PartialState
from . import xla


class CannotPadNestedTensorWarning(UserWarning):
    """`pad_across_processes` met a nested tensor, which it leaves unpadded."""


# -- collectives -----------------------------------------------------------------------------------------

def _runs_distributed(state: PartialState) -> bool:
    return state.distributed_type in TORCH_DISTRIBUTED_TYPES and state.num_processes > 1


def _on_xla(state: PartialState) -> bool:
    """Several XLA replicas: the collectives below go through torch_xla (distributed/xla.py)."""
    return state.distributed_type == DistributedType.XLA and state.num_processes > 1


def _describe(data) -> list:
    """Flat list of (shape, dtype, device type) for every tensor leaf, comparable across ranks."""
    leaves = []
    recursively_apply(
        lambda t: leaves.append((tuple(t.shape), str(t.dtype).replace("torch.", ""), t.device.type)), data
    )
    return leaves


def _check_same_across_ranks(operation: str, data, compare_shapes: bool = True) -> None:
    """Raise the same DistributedOperationException on every rank when the ranks' inputs disagree.

    The descriptions (with each rank's call site) travel through `all_gather_object`, which works whatever the
    tensors look like, so every rank sees every description and takes the same decision: all raise, or none.
    """
    import torch.distributed as dist

    from ..resilience.hang_doctor import call_site

    state = PartialState()
    described = _describe(data)
    if not compare_shapes:
        described = [(len(shape), dtype, device) for shape, dtype, device in described]
    # The common case (all agree) costs one all_gather of a checksum; only a mismatch ships the descriptions.
    mine = torch.tensor([zlib.crc32(repr(described).encode())], dtype=torch.int64, device=state.device)
    checksums = [torch.empty_like(mine) for _ in range(state.num_processes)]
    dist.all_gather(checksums, mine)
    if all(bool(c == mine) for c in checksums):
        everyone = [(described, None)] * state.num_processes
    else:
        everyone = [None] * state.num_processes
        dist.all_gather_object(everyone, (described, call_site(3)))
    sites = [site for _, site in everyone]
    everyone = [desc for desc, _ in everyone]
    reference = everyone[0]
    differing = [rank for rank, desc in enumerate(everyone) if desc != reference]

    def shown(shape):
        return str(list(shape)) if compare_shapes else f"{shape}-d"

    if differing:
        what = "shapes and dtypes" if compare_shapes else "number of dimensions and dtypes"
        listing = "; ".join(
            f"rank {rank}: " + (", ".join(f"{shown(s)} {d} on {dev}" for s, d, dev in desc) or "no tensors")
            + f" at {sites[rank]}"
            for rank, desc in enumerate(everyone)
        )
        error = DistributedOperationException(
            f"`{operation}` got tensors whose {what} differ across processes (rank {differing[0]} differs "
            f"from rank 0): {listing}. Make them match on every rank (e.g. `pad_across_processes` first)."
        )
        # Every rank raises this same error, in step: the hang doctor has nothing to add but a report.
        error.hasten_consistent = True
        error.hasten_report = f"hasten debug mode: {error}"
        error.hasten_reporter = state.process_index == 0
        error.hasten_peer_loss = state.process_index not in differing
        raise error
    wrong_device = sorted({dev for _, _, dev in reference if dev != state.device.type})
    if wrong_device:
        raise DistributedOperationException(
            f"`{operation}` got tensors on {', '.join(wrong_device)} but this run's processes use "
            f"{state.device.type}; move them first with `tensor.to(state.device)` or `send_to_device`."
        )


def _verify(operation: str, compare_shapes: bool = True):
    """Debug-mode guard: compare inputs across ranks before a collective that would hang on a mismatch.

    The hang doctor (`hasten.resilience.hang_doctor`) watches the whole operation as one collective named `operation`.
    """

    def decorator(function):
        @wraps(function)
        def wrapper(data, *args, **kwargs):
            state = PartialState()
            if state.debug and _runs_distributed(state):
                from ..resilience import hang_doctor

                with hang_doctor.watch(operation):
                    _check_same_across_ranks(operation, data, compare_shapes)
                    return function(data, *args, **kwargs)
            return function(data, *args, **kwargs)

        return wrapper

    return decorator


def verify_operation(function):
    """Decorator for a collective over `tensor` (its first argument or `tensor=`): in debug mode on several
    processes, first check that every rank passes the same shapes and dtypes, on the run's device, and raise a
    DistributedOperationException naming each rank's shapes instead of hanging."""
    operation = f"{function.__module__}.{function.__name__}"

    @wraps(function)
    def wrapper(*args, **kwargs):
        state = PartialState()
        if state.debug and _runs_distributed(state):
            _check_same_across_ranks(operation, kwargs["tensor"] if "tensor" in kwargs else args[0], True)
        return function(*args, **kwargs)

    return wrapper


def chained_operation(function):
    """Decorator: a DistributedOperationException raised inside `function` is raised again naming `function`, with
    the first one as its cause (for operations built on verified collectives)."""
    operation = f"{function.__module__}.{function.__name__}"

    @wraps(function)
    def wrapper(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except DistributedOperationException as error:
            raise DistributedOperationException(
                f"Error found while calling `{operation}`. Please see the earlier error for more details."
            ) from error

    return wrapper


# The dtype codes of `gather_tensor_shape` (the numbering Accelerate uses, so stored codes mean the same).
TENSOR_TYPE_TO_INT = {
    torch.float: 1, torch.double: 2, torch.half: 3, torch.bfloat16: 4, torch.uint8: 5, torch.int8: 6,
    torch.int16: 7, torch.int32: 8, torch.int64: 9, torch.bool: 10,
}
TENSOR_INT_TO_DTYPE = {code: dtype for dtype, code in TENSOR_TYPE_TO_INT.items()}


def gather_tensor_shape(tensor):
    """`(shape, dtype code)` of a tensor that one process holds (the others pass None), on every process: the shape
    as a 1-d integer tensor on this process's device, the code a key of `TENSOR_INT_TO_DTYPE`. A collective."""
    state = PartialState()
    mine = None if tensor is None else (list(tensor.shape), TENSOR_TYPE_TO_INT[tensor.dtype])
    held = [entry for entry in gather_object([mine]) if entry is not None]
    if not held:
        raise ValueError("gather_tensor_shape: no process passed a tensor; the one that holds it must pass it")
    shape, code = held[0]
    return torch.tensor(shape, dtype=torch.int64, device=state.device), code


def is_torch_xpu_tensor(tensor) -> bool:
    return isinstance(tensor, torch.Tensor) and tensor.device.type == "xpu"


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
    state = PartialState()
    if _on_xla(state):
        return recursively_apply(xla.all_gather, tensor, error_on_other_type=True)
    if not _runs_distributed(state):
        return tensor
    return recursively_apply(_gather_one, tensor, error_on_other_type=True)


def gather_object(object: Any):
    """All-gather picklable objects; the per-rank lists are concatenated (identity in one process)."""
    import torch.distributed as dist

    state = PartialState()
    if _on_xla(state):  # Accelerate raises NotImplementedError here
        return [item for per_rank in xla.all_gather_objects(object) for item in per_rank]
    if not _runs_distributed(state):
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
    state = PartialState()
    if _on_xla(state):
        return recursively_apply(xla.broadcast_, tensor, src=from_process, error_on_other_type=True)
    if not _runs_distributed(state):
        return tensor
    return recursively_apply(_broadcast_one, tensor, src=from_process, error_on_other_type=True)


def broadcast_object_list(object_list: list, from_process: int = 0) -> list:
    """Broadcast a list of picklable objects in place from `from_process`."""
    import torch.distributed as dist

    state = PartialState()
    if _on_xla(state):
        object_list[:] = xla.broadcast_object(list(object_list), from_process)
    elif _runs_distributed(state):
        dist.broadcast_object_list(object_list, src=from_process)
    return object_list


@_verify("reduce")
def reduce(tensor, reduction: str = "mean", scale: float = 1.0):
    """All-reduce every tensor leaf: `sum`, `mean` or `max`. As in Accelerate, `none` (and anything else) sums."""
    import torch.distributed as dist

    state = PartialState()

    def _reduce_one(t):
        if _on_xla(state):
            return xla.all_reduce(t, reduction, scale)
        out = t.clone()
        if not _runs_distributed(state):
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

    # Warned on one process too (as Accelerate does), so the gap shows before the run scales out.
    if _has_nested_tensor(tensor):
        warnings.warn("pad_across_processes cannot pad a nested tensor; it is returned unchanged (pad its components, "
                      "or convert it with `torch.nested.to_padded_tensor`, first)", CannotPadNestedTensorWarning,
                      stacklevel=3)
    state = PartialState()
    if not (_runs_distributed(state) or _on_xla(state)):
        return tensor
    return recursively_apply(_pad_one, tensor, error_on_other_type=True)


def _has_nested_tensor(data) -> bool:
    if isinstance(data, torch.Tensor):
        return data.is_nested
    if isinstance(data, Mapping):
        data = data.values()
    elif not isinstance(data, (list, tuple)):
        return False
    return any(_has_nested_tensor(item) for item in data)


def copy_tensor_to_devices(tensor=None):
    """Share a tensor that exists on exactly one rank (others pass None) with every rank."""
    state = PartialState()
    if not (_runs_distributed(state) or _on_xla(state)):
        return tensor
    descriptions = gather_object([None if tensor is None else (tuple(tensor.shape), tensor.dtype)])
    owners = [i for i, d in enumerate(descriptions) if d is not None]
    if len(owners) != 1:
        raise ValueError(f"copy_tensor_to_devices needs the tensor on exactly one rank, got it on ranks {owners}")
    shape, dtype = descriptions[owners[0]]
    if tensor is None:
        tensor = torch.zeros(shape, dtype=dtype, device=state.device)
    return reduce(tensor.to(state.device), reduction="sum")


def wait_for_everyone() -> None:
    PartialState().wait_for_everyone()


__all__ = [
    "TensorInformation", "broadcast", "broadcast_object_list", "concatenate", "convert_outputs_to_fp32",
    "convert_to_fp32", "copy_tensor_to_devices", "find_batch_size", "find_device", "gather", "gather_object",
    "get_data_structure", "get_shape", "honor_type", "ignorant_find_batch_size", "initialize_tensors",
    "is_namedtuple", "is_tensor_information", "is_torch_tensor", "listify", "pad_across_processes",
    "pad_input_tensors", "recursively_apply", "reduce", "send_to_device", "slice_tensors", "wait_for_everyone",
    "DistributedOperationException", "DistributedType", "CannotPadNestedTensorWarning",
]
