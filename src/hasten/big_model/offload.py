"""Weights that live outside the model: `.dat` offload folders, safetensors files read in place, prefetching.

Accelerate's formats are kept (`<name>.dat` numpy memmaps plus `index.json`; index entries that point at a
safetensors file), so an offload folder written by either library is read by the other. What differs is how
the bytes are read:

- A safetensors file is memory-mapped once per process (`MappedSafetensors`) and each weight is a view of
  that mapping: no copy into an offload folder, no re-parsing of the header for every weight.
- `.dat` files are mapped copy-on-write instead of copied into a fresh tensor.
- `OffloadedWeightsLoader.prefetch(keys)` asks the kernel to read the next block's pages ahead
  (`madvise(WILLNEED)`) and, where a weight needs a dtype cast, casts it on a background thread, so the block
  about to run finds its weights ready. Each prefetched weight is handed out once, then dropped.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from ..core.dtypes import SAFETENSORS_DTYPES
from ..core.errors import OffloadError

INDEX_NAME = "index.json"


# -- .dat files (Accelerate's offload folder format) -----------------------------------------------------------
def offload_weight(weight, weight_name, offload_folder, index=None):
    """Write `weight` to `<offload_folder>/<weight_name>.dat` and record its dtype and shape in `index`."""
    dtype = None
    # numpy has no bfloat16 or float8: store their bits as int16 / int8 and remember the real dtype.
    if weight.dtype == torch.bfloat16:
        weight, dtype = weight.view(torch.int16), "bfloat16"
    elif str(weight.dtype).startswith("torch.float8_"):
        weight, dtype = weight.view(torch.int8), str(weight.dtype).split(".")[1]
    array = weight.detach().cpu().numpy()
    if index is not None:
        index[weight_name] = {"dtype": dtype or str(array.dtype), "shape": list(array.shape)}
    if array.ndim == 0:
        array = array[None]
    target = np.memmap(os.path.join(offload_folder, f"{weight_name}.dat"), dtype=array.dtype, mode="w+",
                       shape=array.shape)
    target[:] = array[:]
    target.flush()
    del target
    return index


def _dat_array(weight_file, weight_info):
    shape = tuple(weight_info["shape"]) or (1,)
    dtype = weight_info["dtype"]
    stored = "int16" if dtype == "bfloat16" else "int8" if dtype.startswith("float8_") else dtype
    if 0 in shape:
        return np.empty(shape, dtype=stored)
    # mode "c": a private copy-on-write mapping; pages are read when touched, writes never reach the file.
    return np.memmap(weight_file, dtype=stored, shape=shape, mode="c")


def _dat_tensor(array, weight_info) -> torch.Tensor:
    tensor = torch.from_numpy(array)
    if len(weight_info["shape"]) == 0:
        tensor = tensor.reshape(())
    dtype = weight_info["dtype"]
    if dtype == "bfloat16":
        tensor = tensor.view(torch.bfloat16)
    elif dtype.startswith("float8_"):
        tensor = tensor.view(getattr(torch, dtype))
    return tensor


def load_offloaded_weight(weight_file, weight_info):
    """The tensor `offload_weight` wrote (memory-mapped copy-on-write: reading it does not copy the file)."""
    return _dat_tensor(_dat_array(weight_file, weight_info), weight_info)


def save_offload_index(index, offload_folder):
    """Merge `index` into `<offload_folder>/index.json` (written whole through a temporary file)."""
    if not index:
        return
    path = os.path.join(offload_folder, INDEX_NAME)
    current = {}
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as handle:
            current = json.load(handle)
    current.update(index)
    temp = f"{path}.tmp-{os.getpid()}"
    with open(temp, "w", encoding="utf-8") as handle:
        json.dump(current, handle, indent=2)
    os.replace(temp, path)


def offload_state_dict(save_dir, state_dict):
    """Write every tensor of `state_dict` to `save_dir` as `.dat` files, plus `index.json`."""
    os.makedirs(save_dir, exist_ok=True)
    index = {}
    for name, tensor in state_dict.items():
        index = offload_weight(tensor, name, save_dir, index=index)
    save_offload_index(index, save_dir)


def extract_submodules_state_dict(state_dict, submodule_names):
    """The entries of `state_dict` that belong to the given modules (the name itself or under `name.`)."""
    result = {}
    for module_name in submodule_names:
        prefix = module_name + "."
        result.update({key: value for key, value in state_dict.items() if key == module_name or key.startswith(prefix)})
    return result


# -- safetensors files read in place ---------------------------------------------------------------------------
class MappedSafetensors:
    """One safetensors file, memory-mapped copy-on-write; `tensor(name)` is a view of the mapping (no copy).

    The header is parsed once. Views of a private mapping are safe to write to (the file never changes) and
    cost no memory until touched; the kernel may drop clean pages under pressure and read them again.
    """

    def __init__(self, path: str):
        self.path = path
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size < 8:
                raise OffloadError(f"{path} is not a safetensors file (only {size} bytes)")
            (header_len,) = struct.unpack("<Q", handle.read(8))
            if header_len > size - 8:
                raise OffloadError(f"{path} is not a safetensors file (its header length {header_len} is past the end)")
            try:
                header = json.loads(handle.read(header_len))
            except ValueError:
                raise OffloadError(f"{path} is not a safetensors file (its header is not JSON)") from None
            self.metadata = header.pop("__metadata__", None)
            self.entries = header
            self._data_start = 8 + header_len
            end = max((entry["data_offsets"][1] for entry in header.values()), default=0)
            if self._data_start + end > size:
                raise OffloadError(f"{path} is truncated: its header lists {self._data_start + end} bytes, the file "
                                   f"has {size}")
            self._mmap = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)
        # One uint8 view of the whole file; every weight is a slice of it.
        self._bytes = torch.frombuffer(self._mmap, dtype=torch.uint8)

    def keys(self):
        return list(self.entries)

    def _span(self, name):
        entry = self.entries[name]
        begin, end = entry["data_offsets"]
        return self._data_start + begin, self._data_start + end

    def tensor(self, name: str) -> torch.Tensor:
        entry = self.entries[name]
        dtype = SAFETENSORS_DTYPES.get(entry["dtype"])
        if dtype is None:
            raise OffloadError(f"{self.path}: weight {name!r} has dtype {entry['dtype']}, which hasten cannot read")
        shape = entry["shape"]
        begin, end = self._span(name)
        if begin == end:
            return torch.empty(shape, dtype=dtype)
        raw = self._bytes[begin:end]
        itemsize = torch.empty((), dtype=dtype).element_size()
        if begin % itemsize:
            raw = raw.clone()  # misaligned for this dtype: one copy rather than an error
        return raw.view(dtype).view(shape)

    def prefetch(self, name: str) -> None:
        """Ask the kernel to start reading this weight's pages (returns at once)."""
        if not hasattr(mmap, "MADV_WILLNEED"):
            return
        begin, end = self._span(name)
        start = begin - begin % mmap.PAGESIZE
        if end > start:
            try:
                self._mmap.madvise(mmap.MADV_WILLNEED, start, end - start)
            except (OSError, ValueError):  # advice only
                pass


_mapped_files: dict = {}
_mapped_lock = threading.Lock()


def mapped_safetensors(path) -> MappedSafetensors:
    """The process-wide mapping of a safetensors file (mapped again if the file was replaced since)."""
    path = os.path.abspath(os.fspath(path))
    stat = os.stat(path)
    key = (path, stat.st_ino, stat.st_size, stat.st_mtime_ns)
    with _mapped_lock:
        mapped = _mapped_files.get(key)
        if mapped is None:
            for old in [k for k in _mapped_files if k[0] == path]:
                del _mapped_files[old]
            mapped = _mapped_files[key] = MappedSafetensors(path)
        return mapped


def forget_mapped_files() -> None:
    """Drop the cached mappings (tensors that still view them keep them alive)."""
    with _mapped_lock:
        _mapped_files.clear()


# -- mappings of offloaded weights -----------------------------------------------------------------------------
class PrefixedDataset(Mapping):
    """`dataset` seen through a key prefix: `ds[key] == dataset[prefix + key]`.

    `len()` is the length of the whole underlying mapping, as in Accelerate.
    """

    def __init__(self, dataset: Mapping, prefix: str):
        self.dataset = dataset
        self.prefix = prefix

    def __getitem__(self, key):
        return self.dataset[f"{self.prefix}{key}"]

    def __iter__(self):
        return iter([key for key in self.dataset if key.startswith(self.prefix)])

    def __len__(self):
        return len(self.dataset)

    def prefetch(self, keys) -> None:
        prefetch = getattr(self.dataset, "prefetch", None)
        if prefetch is not None:
            prefetch([f"{self.prefix}{key}" for key in keys])


class OffloadedWeightsLoader(Mapping):
    """Offloaded weights by name: from `state_dict` first, else from the offload index (a `.dat` file in
    `save_folder`, or a weight inside a safetensors file), placed on `device` (default: CPU)."""

    def __init__(self, state_dict=None, save_folder=None, index=None, device=None):
        if state_dict is None and save_folder is None and index is None:
            raise OffloadError(
                "OffloadedWeightsLoader needs a `state_dict`, a `save_folder` or an `index` of offloaded weights"
            )
        self.state_dict = {} if state_dict is None else state_dict
        self.save_folder = save_folder
        if index is None and save_folder is not None:
            index_path = os.path.join(save_folder, INDEX_NAME)
            if not os.path.isfile(index_path):
                raise OffloadError(f"{save_folder} holds no {INDEX_NAME}: it is not an offload folder")
            with open(index_path) as handle:
                index = json.load(handle)
        self.index = {} if index is None else index
        self.all_keys = list(self.state_dict.keys())
        seen = set(self.all_keys)
        self.all_keys.extend(key for key in self.index if key not in seen)
        self.device = device
        self._ready: dict = {}
        self._ready_lock = threading.Lock()
        self._executor = None

    def _load(self, key: str) -> torch.Tensor:
        if key in self.state_dict:
            return self.state_dict[key]
        info = self.index[key]
        if info.get("safetensors_file") is not None:
            tensor = mapped_safetensors(info["safetensors_file"]).tensor(info.get("weight_name", key))
            if "dtype" in info:
                tensor = tensor.to(getattr(torch, info["dtype"].replace("torch.", "")))
        else:
            if self.save_folder is None:
                raise OffloadError(f"offloaded weight {key!r} is a .dat file but this loader has no `save_folder`")
            # `weight_name`: a tied alias that shares its twin's file.
            tensor = load_offloaded_weight(os.path.join(self.save_folder, f"{info.get('weight_name', key)}.dat"), info)
        if self.device is not None and tensor.device != torch.device(self.device):
            tensor = tensor.to(self.device)
        return tensor

    def __getitem__(self, key: str):
        with self._ready_lock:
            pending = self._ready.pop(key, None)
        if pending is not None:
            return pending.result()
        return self._load(key)

    def __iter__(self):
        return iter(self.all_keys)

    def __len__(self):
        return len(self.all_keys)

    def _needs_work(self, key) -> bool:
        """Whether reading `key` costs more than a view of a mapping (a cast, or a copy to a device)."""
        info = self.index.get(key)
        if key in self.state_dict or info is None:
            return False
        return "dtype" in info and info.get("safetensors_file") is not None or (
            self.device is not None and torch.device(self.device).type != "cpu"
        )

    def prefetch(self, keys) -> None:
        """Get the weights `keys` ready before they are asked for: pages are read ahead by the kernel; casts
        run on a background thread. Replaces any earlier prefetch not yet consumed (memory stays bounded by
        one block)."""
        keys = [key for key in keys if key in self.index and key not in self.state_dict]
        if not keys:
            return
        for key in keys:
            info = self.index[key]
            if info.get("safetensors_file") is not None:
                mapped_safetensors(info["safetensors_file"]).prefetch(info.get("weight_name", key))
        heavy = [key for key in keys if self._needs_work(key)]
        with self._ready_lock:
            self._ready.clear()
            if not heavy:
                return
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hasten-prefetch")
            for key in heavy:
                self._ready[key] = self._executor.submit(self._load, key)

    def __del__(self):
        executor = getattr(self, "_executor", None)
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)


def safetensors_offload_entry(path: str, weight_name: str, dtype=None) -> dict:
    """An index entry pointing at a weight inside a safetensors file (the format Accelerate reads too)."""
    entry = {"safetensors_file": os.path.abspath(path), "weight_name": weight_name}
    if dtype is not None:
        entry["dtype"] = str(dtype).replace("torch.", "")
    return entry
