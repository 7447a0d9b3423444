"""The file layer of checkpoints: durable writes, the completeness marker, safe loading, sharding.

Nothing here knows about the `Accelerator`; `checkpointing.py` decides what goes into which file.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import re
import shutil
import signal

import torch

from .errors import CheckpointError, ConfigError, UnsafeCheckpointError

MARKER_NAME = "hasten_checkpoint.json"
MARKER_FORMAT = "hasten-checkpoint"
# Temporary and replaced folders are hidden (leading dot) and carry these tags, so neither automatic
# naming nor `load_state()` can take one for a checkpoint.
TEMP_TAG = ".hasten-tmp-"
OLD_TAG = ".hasten-old-"

# Test hook (documented in docs/checkpointing.md): with HASTEN_TEST_CRASH_AT=N the process SIGKILLs itself at
# the N-th crash point of its saves; HASTEN_TEST_CRASH_RANK limits it to one rank. Crash points sit before each
# file, in the middle of it (the file is cut to half its size first) and after it, and between commit steps.
CRASH_ENV = "HASTEN_TEST_CRASH_AT"
CRASH_RANK_ENV = "HASTEN_TEST_CRASH_RANK"
_crash_counter = [0]


def crash_point(rank: int = 0, partial_file: str | None = None) -> None:
    target = os.environ.get(CRASH_ENV)
    if not target:
        return
    only_rank = os.environ.get(CRASH_RANK_ENV)
    if only_rank not in (None, "") and int(only_rank) != rank:
        return
    _crash_counter[0] += 1
    if _crash_counter[0] != int(target):
        return
    if partial_file is not None and os.path.isfile(partial_file):
        with open(partial_file, "r+b") as handle:
            handle.truncate(os.path.getsize(partial_file) // 2)
    os.kill(os.getpid(), signal.SIGKILL)


# -- durable writes ---------------------------------------------------------------------------------------------
def fsync_file(path: str) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def fsync_dir(path: str) -> None:
    # A rename or a new file is durable only once its directory entry is flushed.
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def fsync_tree(path: str) -> None:
    """fsync every file and folder under `path` (used for folders a backend wrote itself)."""
    for root, _dirs, files in os.walk(path):
        for name in files:
            fsync_file(os.path.join(root, name))
        fsync_dir(root)


def write_file(path: str, writer, rank: int = 0, sync: bool = True) -> int:
    """Call `writer(path)`, flush the file to disk (unless `sync=False`: the caller fsyncs a batch of files
    later, so that writing one file overlaps with the disk flushing the last) and return its size; crash
    points surround it."""
    crash_point(rank)
    writer(path)
    crash_point(rank, partial_file=path)
    if sync:
        fsync_file(path)
    crash_point(rank)
    return os.path.getsize(path)


def save_tensors(tensors: dict, path: str) -> None:
    from safetensors.torch import save_file

    save_file({k: v.detach().contiguous() for k, v in tensors.items()}, path, metadata={"format": "pt"})


def save_object(obj, path: str) -> None:
    torch.save(obj, path)


def save_json(obj, path: str) -> None:
    with open(path, "w") as handle:
        json.dump(obj, handle, indent=2, sort_keys=True)
        handle.write("\n")


def atomic_write(path: str, writer) -> None:
    """Write through a hidden sibling and rename it over `path`: readers see the old file or the new one."""
    folder, name = os.path.split(os.path.abspath(path))
    temp = os.path.join(folder, f".{name}{TEMP_TAG}{os.getpid()}")
    try:
        writer(temp)
        fsync_file(temp)
        os.replace(temp, path)
    finally:
        if os.path.exists(temp):
            os.remove(temp)
    fsync_dir(folder)


# -- the completeness marker ------------------------------------------------------------------------------------
def read_marker(folder: str):
    """The marker's content, or None when the folder has none (e.g. a checkpoint Accelerate wrote)."""
    path = os.path.join(folder, MARKER_NAME)
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as handle:
            marker = json.load(handle)
    except (OSError, ValueError) as error:
        raise CheckpointError(f"{path} is unreadable ({error}); the checkpoint in {folder} is damaged") from None
    if not isinstance(marker, dict) or marker.get("format") != MARKER_FORMAT:
        raise CheckpointError(f"{path} is not a hasten checkpoint marker; the checkpoint in {folder} is damaged")
    return marker


def verify_files(folder: str, marker: dict) -> None:
    """Every file the marker lists exists with its recorded size; raises CheckpointError naming the first bad one."""
    if not marker.get("complete", False):
        raise CheckpointError(
            f"the checkpoint in {folder} is incomplete: a save into it was interrupted; load an older checkpoint"
        )
    for name, size in sorted(marker.get("files", {}).items()):
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            raise CheckpointError(f"checkpoint file {path} is missing (listed in {MARKER_NAME})")
        actual = os.path.getsize(path)
        if actual != size:
            raise CheckpointError(
                f"checkpoint file {path} has {actual} bytes but {size} were written: the file is truncated or corrupt"
            )


def is_complete(folder: str) -> bool:
    try:
        marker = read_marker(folder)
        if marker is None:
            return False
        verify_files(folder, marker)
    except CheckpointError:
        return False
    return True


# -- safe loading -----------------------------------------------------------------------------------------------
def _numpy_safe_globals() -> list:
    """Constructors of plain numeric NumPy arrays (Accelerate's RNG files hold one); they run no user code."""
    import numpy as np

    entries = [np.ndarray, np.dtype]
    core = getattr(np, "_core", None) or np.core
    for module_name in ("numpy.core.multiarray", "numpy._core.multiarray"):
        entries.append((core.multiarray._reconstruct, f"{module_name}._reconstruct"))
    dtypes = getattr(np, "dtypes", None)
    if dtypes is not None:
        entries.extend(getattr(dtypes, n) for n in ("UInt32DType", "Int64DType", "Float64DType", "Float32DType")
                       if hasattr(dtypes, n))
    return entries


def load_object(path: str, load_kwargs: dict | None = None, map_location="cpu"):
    """torch.load with `weights_only=True` unless the caller opted in with `{"weights_only": False}`."""
    kwargs = dict(load_kwargs or {})
    kwargs.setdefault("weights_only", True)
    kwargs.setdefault("map_location", map_location)
    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint file {path} is missing")
    safe = kwargs["weights_only"]
    context = torch.serialization.safe_globals(_numpy_safe_globals()) if safe else contextlib.nullcontext()
    try:
        with context:
            return torch.load(path, **kwargs)
    except pickle.UnpicklingError as error:
        message = str(error)
        # torch names the refused global ("GLOBAL posix.system", "Unsupported global: GLOBAL ..."); other
        # weights-only failures ("Unsupported operand 110") mean the bytes are not a pickle at all.
        refused = re.search(r"GLOBAL ([\w.]+)", message)
        if safe and (refused or "Can only build" in message or "Unsupported class" in message):
            what = f" ({refused.group(1)})" if refused else ""
            raise UnsafeCheckpointError(
                f"refusing to load {path}: it holds pickled Python objects{what} that could run code when loaded. "
                "If you trust this file, opt in with load_state(..., load_kwargs={'weights_only': False})"
            ) from None
        raise CheckpointError(f"checkpoint file {path} is corrupt ({message.splitlines()[-1][:200] if message else error})") from None
    except (RuntimeError, EOFError, OSError, ValueError) as error:
        raise CheckpointError(f"checkpoint file {path} is corrupt or truncated ({error})") from None


def load_tensors(path: str, device="cpu") -> dict:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint file {path} is missing")
    try:
        return load_file(path, device=str(device))
    except (SafetensorError, OSError, ValueError, RuntimeError) as error:
        raise CheckpointError(f"checkpoint file {path} is corrupt or truncated ({error})") from None


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


def remove_tree(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)
