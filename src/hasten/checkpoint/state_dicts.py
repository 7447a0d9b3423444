"""Tensors that share memory (tied weights) and splitting a state dict into size-bounded shards."""

from __future__ import annotations

import re

import torch

from ..core.errors import ConfigError


# -- tensors that share memory ----------------------------------------------------------------------------------
def _storage_key(tensor: torch.Tensor):
    if tensor.device.type == "meta":
        return None
    return (tensor.device, tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape),
            tuple(tensor.stride()), tensor.dtype)


def drop_aliases(state_dict: dict) -> dict:
    """Keep the first name of tensors that are views of the same memory (tied weights): safetensors refuses them."""
    seen, kept = set(), {}
    for name, value in state_dict.items():
        if not isinstance(value, torch.Tensor):
            continue
        key = _storage_key(value)
        if key is not None and key in seen:
            continue
        if key is not None:
            seen.add(key)
        kept[name] = value
    return kept


def fill_aliases(model: torch.nn.Module, loaded: dict) -> dict:
    """Add back the names `drop_aliases` removed, from the model's own tied tensors."""
    groups: dict = {}
    for name, value in model.state_dict(keep_vars=True).items():
        if isinstance(value, torch.Tensor):
            groups.setdefault(_storage_key(value), []).append(name)
    for names in groups.values():
        present = [n for n in names if n in loaded]
        if present:
            for name in names:
                loaded.setdefault(name, loaded[present[0]])
    return loaded


# -- sizes and shards -------------------------------------------------------------------------------------------
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_size(value) -> int:
    """Bytes from an int or a string like "5MB" (decimal), "5MiB" (binary) or "10GB"."""
    if isinstance(value, bool):
        raise ConfigError(f"max_shard_size must be an int or a string like '5GB', got {value!r}")
    if isinstance(value, int):
        if value <= 0:
            raise ConfigError(f"max_shard_size must be positive, got {value}")
        return value
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B?)\s*", str(value).upper())
    if match is None or match.group(2) not in _UNITS:
        raise ConfigError(
            f"max_shard_size {value!r} is not a size; use an int (bytes) or a string like '500MB', '10GB' or '5MiB'"
        )
    size = int(float(match.group(1)) * _UNITS[match.group(2)])
    if size <= 0:
        raise ConfigError(f"max_shard_size must be positive, got {value!r}")
    return size


def tensor_bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def split_into_shards(state_dict: dict, max_bytes: int) -> list:
    """Group names in order into shards of at most `max_bytes`; a tensor larger than that gets its own shard."""
    shards, current, current_size = [], [], 0
    for name, tensor in state_dict.items():
        size = tensor_bytes(tensor)
        if size > max_bytes:
            shards.append([name])
            continue
        if current and current_size + size > max_bytes:
            shards.append(current)
            current, current_size = [], 0
        current.append(name)
        current_size += size
    if current or not shards:
        shards.append(current)
    return shards
