"""The file layer of checkpoints: durable writes, the completeness marker, safe loading, sharding.

Nothing here knows about the `Accelerator`; `checkpointing.py` decides what goes into which file.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import pickle
import re
import shutil
import signal
import struct
import threading
import weakref
import zipfile
from concurrent.futures import ThreadPoolExecutor

import torch

from ..core.errors import CheckpointError, ConfigError, UnsafeCheckpointError

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
    """A safetensors file, written straight from the tensors' memory. (safetensors' `save_file` first copies
    every tensor into a bytes object: a second copy of the checkpoint in memory, and its time.)"""
    prepared = {name: t.detach().to("cpu").contiguous() for name, t in tensors.items()}
    names = {t.dtype: _SAFETENSORS_NAMES.get(t.dtype) for t in prepared.values()}
    if None in names.values():
        from safetensors.torch import save_file

        save_file(prepared, path, metadata={"format": "pt"})
        return
    # safetensors' own order (dtype rank descending, i.e. wider items first, then name): the bytes equal
    # save_file's, and with the header padded to 8 bytes every tensor starts aligned.
    order = sorted(prepared, key=lambda name: (-_SAFETENSORS_RANK.index(names[prepared[name].dtype]), name))
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name in order:
        tensor = prepared[name]
        size = tensor.numel() * tensor.dtype.itemsize
        header[name] = {"dtype": names[tensor.dtype], "shape": list(tensor.shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)
    views = [memoryview(prepared[name].reshape(-1).view(torch.uint8).numpy()) for name in order
             if prepared[name].numel()]
    with open(path, "wb", buffering=0) as handle:
        _write_all(handle.fileno(), [memoryview(struct.pack("<Q", len(text)) + text), *views])


def _write_all(fd: int, views: list) -> None:
    """os.writev in calls of at most REQUEST_BYTES and _IOV_MAX buffers, resuming after short writes."""
    pending = list(views)
    while pending:
        batch, total = [], 0
        while pending and len(batch) < _IOV_MAX and total < REQUEST_BYTES:
            view = pending[0]
            take = min(len(view), REQUEST_BYTES - total)
            batch.append(view[:take])
            total += take
            if take == len(view):
                pending.pop(0)
            else:
                pending[0] = view[take:]
        written = os.writev(fd, batch)
        if written < total:  # short write: put back what did not go out
            rest = []
            for view in batch:
                skip = min(written, len(view))
                written -= skip
                if skip < len(view):
                    rest.append(view[skip:])
            pending[:0] = rest


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
    """torch.load with `weights_only=True` unless the caller opted in with `{"weights_only": False}`; a
    torch zip file read safely onto the CPU takes the fast path (`_plan_torch_file`)."""
    kwargs = dict(load_kwargs or {})
    pending = _take_prefetched(path, "torch", kwargs, map_location)
    if pending is None and _fast_torch_options(kwargs, map_location):
        pending = _plan_torch_file(path, kwargs)
        if pending is not None:
            pending.start()
    if pending is not None:
        return pending.result()
    return _torch_load(path, kwargs, map_location)


def _torch_load(path: str, load_kwargs: dict | None = None, map_location="cpu"):
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


def load_tensors(path: str, device="cpu", into: dict | None = None) -> dict:
    """The tensors of a safetensors file, each in its own memory, read in large parallel requests.

    `into` (e.g. the model's own `state_dict()`): a tensor of the same name, dtype and shape that is contiguous
    CPU memory receives the file's bytes directly and is returned in place of a new tensor, saving a copy and
    fresh memory; `model.load_state_dict` then finds nothing to copy. As with `load_state_dict`, an error in
    the middle leaves such tensors partly loaded (a file too short for its header is refused before)."""
    pending = _take_prefetched(path, "safetensors", {}, "cpu") if into is None else None
    if pending is None:
        pending = _plan_safetensors(path, into if torch.device(device).type == "cpu" else None)
        if pending is not None:
            pending.start()
    tensors = pending.result() if pending is not None else _safetensors_load(path)
    if torch.device(device).type != "cpu":
        tensors = {name: t.to(device) for name, t in tensors.items()}
    return tensors


def _safetensors_load(path: str) -> dict:
    """The safetensors library's own reader: for dtypes the fast reader does not know."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(path, device="cpu")
    except (SafetensorError, OSError, ValueError, RuntimeError) as error:
        raise CheckpointError(f"checkpoint file {path} is corrupt or truncated ({error})") from None


# -- fast reading -----------------------------------------------------------------------------------------------
# A cold file reads at the disk's speed only with large requests in flight together. So a file is read in
# REQUEST_BYTES requests by READ_THREADS threads (file I/O releases the GIL), each request scattered by one
# os.preadv straight into the memory of the tensors it covers: no page-fault-sized reads through a memory map,
# no second copy. `prefetch` queues several files at once, so that one is read while the previous one is being
# loaded into the model.
REQUEST_BYTES = 16 * 2**20
READ_THREADS = 4
_GAP_BYTES = 2**20  # holes up to this size between tensors (zip headers) are read into scratch, not skipped
_IOV_MAX = 1000  # buffers per preadv call (Linux allows 1024)

_SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool, "U16": torch.uint16, "U32": torch.uint32, "U64": torch.uint64,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2, "C64": torch.complex64,
}

_SAFETENSORS_NAMES = {dtype: name for name, dtype in _SAFETENSORS_DTYPES.items()}
_SAFETENSORS_RANK = ["BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "F16", "BF16", "I32", "U32", "F32",
                     "C64", "F64", "I64", "U64"]

_pool_state = {"pool": None, "pid": None}
_pool_lock = threading.Lock()


def _executor() -> ThreadPoolExecutor:
    # A pool inherited through fork has no threads in the child: make a new one there.
    with _pool_lock:
        if _pool_state["pool"] is None or _pool_state["pid"] != os.getpid():
            _pool_state["pool"] = ThreadPoolExecutor(READ_THREADS, thread_name_prefix="hasten-read")
            _pool_state["pid"] = os.getpid()
        return _pool_state["pool"]


def _buffer(nbytes: int) -> torch.Tensor:
    """Fresh, untouched CPU memory for `nbytes` (its pages are faulted in by the read that fills it). Not
    advised for huge pages: where memory is fragmented the kernel compacts it at fault time, which measured
    up to 8x slower than plain pages on a shared machine."""
    return torch.empty(nbytes, dtype=torch.uint8)


def _requests(pieces: list) -> list:
    """Group (file offset, buffer) pieces, sorted by offset, into (offset, [memoryviews]) read requests of about
    REQUEST_BYTES over contiguous file ranges; small holes are read into scratch memory."""
    requests, current, start, end = [], [], 0, 0

    def flush():
        if current:
            requests.append((start, list(current)))
            current.clear()

    for offset, buffer in pieces:
        view = memoryview(buffer.numpy()) if buffer.numel() else None
        if view is None:
            continue
        if current and (offset < end or offset - end > _GAP_BYTES or len(current) >= _IOV_MAX - 1):
            flush()
        if current and offset > end:
            current.append(memoryview(bytearray(offset - end)))
            end = offset
        position = 0
        while position < len(view):
            if not current:
                start = end = offset + position
            room = max(REQUEST_BYTES - (end - start), 0)
            if room == 0 or len(current) >= _IOV_MAX:
                flush()
                continue
            take = min(room, len(view) - position)
            current.append(view[position:position + take])
            position += take
            end += take
    flush()
    return requests


def _read_request(read: PendingRead, offset: int, views: list) -> None:
    # The PendingRead travels with the request: its file stays open until the last request is done.
    fd = read.handle.fileno()
    while views:
        count = os.preadv(fd, views, offset)
        if count == 0:
            raise EOFError(f"the file ends at byte {offset}, before the data it lists")
        offset += count
        while views and count >= len(views[0]):
            count -= len(views[0])
            views.pop(0)
        if views and count:
            views[0] = views[0][count:]


class PendingRead:
    """A file being read in the background: `result()` waits for it and returns what the file holds.

    Every request reads through the one handle opened when the file was planned, so a checkpoint saved over
    the same path meanwhile (a rename) cannot mix two files' bytes."""

    def __init__(self, path: str, kind: str, handle, requests: list, finish):
        self.path, self.kind, self.handle = path, kind, handle
        self.key = _file_key(path, handle)
        self._requests, self._finish, self._futures = requests, finish, None

    def start(self) -> PendingRead:
        pool = _executor()
        self._futures = [pool.submit(_read_request, self, offset, views) for offset, views in self._requests]
        self._requests = None
        return self

    def __del__(self):  # dropped unread (a prefetch nobody took): close the file once no request uses it
        futures = self._futures or ()
        if all(future.done() for future in futures):
            self.handle.close()

    def result(self):
        error = None
        for future in self._futures:
            try:
                future.result()
            except (OSError, EOFError) as failure:
                error = error or failure
        finish, self._finish, self._futures = self._finish, None, None  # the caller owns the memory from here
        self.handle.close()
        if error is not None:
            raise CheckpointError(f"checkpoint file {self.path} is corrupt or truncated ({error})") from None
        return finish()


def _file_key(path: str, handle=None):
    info = os.fstat(handle.fileno()) if handle is not None else os.stat(path)
    return (os.path.abspath(path), info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)


def _target(into: dict | None, name: str, dtype, shape: list, used: set):
    """The bytes of `into[name]` as a flat uint8 tensor, where the file's tensor can be read straight into it."""
    target = None if into is None else into.get(name)
    if (not isinstance(target, torch.Tensor) or type(target) is not torch.Tensor or target.device.type != "cpu"
            or target.dtype != dtype or list(target.shape) != shape or not target.is_contiguous()
            or target.requires_grad or target.numel() == 0 or target.is_conj() or target.is_neg()):
        return None
    pointer = target.data_ptr()
    if pointer in used:  # tied tensors: read once
        return None
    used.add(pointer)
    return target.reshape(-1).view(torch.uint8)


def _plan_safetensors(path: str, into: dict | None = None):
    """A PendingRead (not started) for a safetensors file; None for dtypes the fast reader does not know."""
    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint file {path} is missing")
    handle = open(path, "rb", buffering=0)
    try:
        return _plan_safetensors_from(path, handle, into)
    except BaseException:
        handle.close()
        raise


def _plan_safetensors_from(path: str, handle, into):
    size = os.fstat(handle.fileno()).st_size
    try:
        (header_size,) = struct.unpack("<Q", os.pread(handle.fileno(), 8, 0))
        if header_size > size - 8:
            raise ValueError(f"the header claims {header_size} bytes of a {size}-byte file")
        header = json.loads(os.pread(handle.fileno(), header_size, 8))
        if not isinstance(header, dict):
            raise ValueError("the header is not a JSON object")
    except (struct.error, ValueError, UnicodeDecodeError) as error:
        raise CheckpointError(f"checkpoint file {path} is corrupt or truncated ({error})") from None
    data_start, data_size = 8 + header_size, size - 8 - header_size
    entries, pieces, used, data_end = [], [], set(), 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = _SAFETENSORS_DTYPES.get(info["dtype"])
            shape = [int(d) for d in info["shape"]]
            begin, end = (int(x) for x in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"checkpoint file {path} is corrupt (bad header entry for {name!r})") from None
        if dtype is None:
            handle.close()
            return None
        numel = 1
        for dim in shape:
            numel *= dim
        if min(shape, default=0) < 0 or not 0 <= begin <= end <= data_size or end - begin != numel * dtype.itemsize:
            raise CheckpointError(
                f"checkpoint file {path} is corrupt or truncated ({name!r} lies outside the file's data)"
            )
        entries.append((name, dtype, shape, begin, end))
        data_end = max(data_end, end)
    if data_end != data_size:  # safetensors files end with their last tensor: anything else is damage
        raise CheckpointError(
            f"checkpoint file {path} is corrupt or truncated (its header lists {data_end} bytes of data, it holds "
            f"{data_size})"
        )
    results = []
    for name, dtype, shape, begin, end in entries:
        target = _target(into, name, dtype, shape, used)
        buffer = target if target is not None else _buffer(end - begin)
        results.append((name, into[name] if target is not None else buffer, dtype, shape, target is not None))
        pieces.append((data_start + begin, buffer))
    pieces.sort(key=lambda piece: piece[0])

    def finish():
        return {name: value if in_place else value.view(dtype).reshape(shape)
                for name, value, dtype, shape, in_place in results}

    return PendingRead(path, "safetensors", handle, _requests(pieces), finish)


_LEAVES = (str, bytes, int, float, complex, bool, type(None), torch.dtype, torch.device, torch.Size, slice)


def _fast_torch_options(load_kwargs: dict, map_location) -> bool:
    """The fast path reproduces torch.load for safe loads onto the CPU only."""
    extra = set(load_kwargs) - {"weights_only", "map_location"}
    location = load_kwargs.get("map_location", map_location)
    return (not extra and load_kwargs.get("weights_only", True) is True
            and (location is None or (isinstance(location, (str, torch.device)) and torch.device(location) == torch.device("cpu"))))


def _plan_torch_file(path: str, load_kwargs: dict):
    """A PendingRead (not started) for a torch.save zip file, or None where plain torch.load must do it (legacy
    format, big-endian data, objects other than tensors in plain containers). The structure comes from
    torch.load onto the meta device (the same safe unpickler, no data read), which records where each storage
    lies in the file; the storages are then read in large requests and the tensors rebuilt on them."""
    if not os.path.isfile(path):
        return None  # torch.load names the problem
    handle = open(path, "rb", buffering=0)
    try:
        read = _plan_torch_file_from(path, handle, load_kwargs)
    except BaseException:
        handle.close()
        raise
    if read is None:
        handle.close()
    return read


def _plan_torch_file_from(path: str, handle, load_kwargs: dict):
    try:
        with zipfile.ZipFile(path) as archive:
            infos = archive.infolist()
            if any(i.compress_type != zipfile.ZIP_STORED for i in infos):
                return None
            order = [i for i in infos if i.filename.endswith("/byteorder")]
            if order and archive.read(order[0]) != b"little":
                return None
    except (zipfile.BadZipFile, OSError, ValueError):
        return None
    structure = _torch_load(path, {k: v for k, v in load_kwargs.items() if k != "map_location"}, map_location="meta")
    if _file_key(path) != _file_key(path, handle):
        return None  # replaced while its structure was read: torch.load reads it whole
    buffers, memo = {}, {}
    sizes = {}

    def rebuild(obj):
        if isinstance(obj, torch.Tensor):
            if id(obj) in memo:
                return memo[id(obj)]
            if (type(obj) is not torch.Tensor or obj.layout != torch.strided or not obj.is_meta
                    or obj.is_quantized or obj.is_conj() or obj.is_neg() or vars(obj)):
                raise _NotPlain
            storage = obj.untyped_storage()
            offset = getattr(storage, "_checkpoint_offset", None)
            if offset is None:
                raise _NotPlain
            if offset not in buffers:
                buffers[offset] = _buffer(storage.nbytes())
                sizes[offset] = storage.nbytes()
            elif sizes[offset] != storage.nbytes():
                raise _NotPlain
            tensor = torch.empty(0, dtype=obj.dtype).set_(
                buffers[offset].untyped_storage(), obj.storage_offset(), obj.shape, obj.stride()
            )
            if obj.requires_grad:
                tensor.requires_grad_(True)
            memo[id(obj)] = tensor
            return tensor
        if isinstance(obj, _LEAVES) or type(obj).__module__ == "numpy":
            return obj
        if type(obj) in (dict, collections.OrderedDict):
            if id(obj) not in memo:
                memo[id(obj)] = obj
                for key in list(obj):
                    obj[key] = rebuild(obj[key])
            return obj
        if type(obj) is list:
            if id(obj) not in memo:
                memo[id(obj)] = obj
                obj[:] = [rebuild(item) for item in obj]
            return obj
        if type(obj) in (tuple, set, frozenset):
            return type(obj)(rebuild(item) for item in obj)
        raise _NotPlain

    try:
        result = rebuild(structure)
    except _NotPlain:
        return None
    pieces = sorted(buffers.items())

    def finish():
        return result

    return PendingRead(path, "torch", handle, _requests(pieces), finish)


class _NotPlain(Exception):
    """The file holds something the fast torch reader does not rebuild; plain torch.load reads it."""


# Files queued by `prefetch`, by path; weakly held, so they vanish with the handle prefetch returned.
_prefetched: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


class Prefetch:
    """Keeps the reads `prefetch` queued alive; drop it (return from the caller) to release unused ones."""

    def __init__(self, pending: list):
        self.pending = pending

    def __del__(self):  # reads still in flight finish into memory nobody holds, then go
        for read in self.pending:
            if _prefetched.get(read.key[0]) is read:
                del _prefetched[read.key[0]]


def prefetch(paths, load_kwargs: dict | None = None, map_location="cpu") -> Prefetch:
    """Queue the reads of several files (safetensors, or torch.save files with the same `load_kwargs` as
    `load_object` will get) so that they overlap with loading the earlier ones; `load_tensors` / `load_object`
    of a queued path take the read over. Files that cannot be read fast are skipped (read normally later,
    raising their own errors then)."""
    kwargs = dict(load_kwargs or {})
    pending = []
    for path in paths:
        if not os.path.isfile(path):
            continue
        try:
            if path.endswith(".safetensors"):
                read = _plan_safetensors(path)
            elif _fast_torch_options(kwargs, map_location):
                read = _plan_torch_file(path, kwargs)
            else:
                read = None
        except Exception:  # noqa: BLE001 - the normal load later reports it, in its turn
            read = None
        if read is not None:
            _prefetched[read.key[0]] = read.start()
            pending.append(read)
    return Prefetch(pending)


def _take_prefetched(path: str, kind: str, load_kwargs: dict, map_location):
    read = _prefetched.get(os.path.abspath(path))
    if read is None or read.kind != kind:
        return None
    del _prefetched[read.key[0]]
    if kind == "torch" and not _fast_torch_options(load_kwargs, map_location):
        return None
    try:
        if _file_key(path) != read.key:
            return None
    except OSError:
        return None
    return read


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
