"""Reading model weights back from the files `save_model` (or Hugging Face tools) write."""

from __future__ import annotations

import json
import logging
import os

import torch

from . import checkpoint_io as io
from .errors import CheckpointError, NotSupportedYetError

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
    candidates = [n for n in os.listdir(checkpoint) if n.endswith((".safetensors", ".bin"))]
    if len(candidates) == 1:
        return [os.path.join(checkpoint, candidates[0])]
    raise CheckpointError(
        f"load_checkpoint_in_model: {checkpoint} holds no index ({' or '.join(_INDEX_NAMES)}) and not exactly one "
        f"weights file (found {len(candidates)})"
    )


def _files_from_index(index_path: str) -> list:
    try:
        with open(index_path) as handle:
            weight_map = json.load(handle)["weight_map"]
    except (OSError, ValueError, KeyError) as error:
        raise CheckpointError(f"{index_path} is not a valid weights index ({error})") from None
    folder = os.path.dirname(index_path)
    return [os.path.join(folder, name) for name in sorted(set(weight_map.values()))]


def _read(path: str) -> dict:
    if path.endswith(".safetensors"):
        return io.load_tensors(path)
    return io.load_object(path)


def load_checkpoint_in_model(model: torch.nn.Module, checkpoint, device_map=None, offload_folder=None, dtype=None,
                             offload_state_dict: bool = False, offload_buffers: bool = False,
                             keep_in_fp32_modules=None, offload_8bit_bnb: bool = False, strict: bool = False,
                             full_state_dict: bool = True, broadcast_from_rank0: bool = False) -> None:
    """Load weights (a file, an index JSON, or a folder with shards and an index) into `model`, file by file.

    Tensors keep each parameter's device (parameters on `meta` are materialised on the CPU); `dtype` casts
    floating-point weights. Missing and unexpected names are logged, or raise with `strict=True`.
    """
    if device_map not in (None, {}) or offload_folder is not None or offload_state_dict or offload_buffers or offload_8bit_bnb:
        raise NotSupportedYetError("load_checkpoint_in_model: device maps and offloading are not supported by hasten yet")
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype.replace("torch.", ""))
    keep_fp32 = tuple(keep_in_fp32_modules or ())
    expected = model.state_dict(keep_vars=True)
    seen, unexpected = set(), []
    for path in _weight_files(checkpoint):
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
        # assign=True materialises meta parameters; otherwise copy into the existing storage.
        any_meta = any(expected[n].is_meta for n in chunk)
        model.load_state_dict(chunk, strict=False, assign=any_meta)
        del loaded, chunk
    missing = [name for name in expected if name not in seen]
    if missing:
        # Tied weights are stored once; they are filled when their twin is loaded.
        tied = io.fill_aliases(model, {n: None for n in seen})
        missing = [n for n in missing if n not in tied]
    if strict and (missing or unexpected):
        raise CheckpointError(
            f"load_checkpoint_in_model: missing keys {missing[:5]}{'...' if len(missing) > 5 else ''}, unexpected "
            f"keys {unexpected[:5]}{'...' if len(unexpected) > 5 else ''}"
        )
    if missing:
        logger.warning("load_checkpoint_in_model: %d weight(s) not in the checkpoint: %s", len(missing), missing[:10])
    if unexpected:
        logger.warning("load_checkpoint_in_model: %d unexpected weight(s) in the checkpoint: %s", len(unexpected), unexpected[:10])
