"""Pure helpers over nested structures of tensors (lists, tuples, namedtuples, mappings).

Nothing here talks to other processes or reads the run's state, so every room may import this module
(`state.py`, `training/precision.py`, `data/`, `optimizer.py`); the collectives over the same structures
live in `distributed/operations.py`, which re-exports these names at Accelerate's import paths.
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from dataclasses import dataclass
from functools import wraps

import torch


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
        # Accelerate's exact words: code compares the whole text
        raise TypeError(
            f"Unsupported types ({type(data)}) passed to `{getattr(func, '__name__', func)}`. Only nested "
            f"list/tuple/dicts of objects that are valid for `{test_type.__name__}` should be passed."
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


def _is_hf_dataset(obj) -> bool:
    """A Hugging Face `datasets.Dataset` (recognised without importing `datasets`)."""
    return type(obj).__module__.startswith("datasets.") and callable(getattr(obj, "select", None)) \
        and hasattr(obj, "__len__")


def split_for_process(inputs, process_index: int, num_processes: int, apply_padding: bool, device=None):
    """This process's contiguous share of `inputs` (see `PartialState.split_between_processes`)."""
    if _is_hf_dataset(inputs):
        # `dataset[a:b]` is a dict of columns, not rows: pick the rows (padded with the last row, like lists).
        length = len(inputs)
        per, extra = divmod(length, num_processes)
        start = process_index * per + min(process_index, extra)
        rows = list(range(start, start + per + (1 if process_index < extra else 0)))
        if apply_padding and length:
            rows += [length - 1] * (per + (1 if extra else 0) - len(rows))
        return inputs.select(rows)
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
