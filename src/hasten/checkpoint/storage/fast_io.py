"""Checkpoint bytes at the disk's speed: safetensors written straight from tensor memory, and safetensors / torch
zip files read in large parallel requests straight into tensors, with prefetching of the next file."""

from __future__ import annotations

import bisect
import collections
import json
import os
import struct
import threading
import weakref
import zipfile
from concurrent.futures import ThreadPoolExecutor

import torch

from ...core.dtypes import SAFETENSORS_DTYPES, SAFETENSORS_NAMES
from ...core.errors import CheckpointError
from . import checksum, into_store
from .safe_load import safetensors_load, torch_load_safely


def save_tensors(tensors: dict, path: str) -> None:
    """A safetensors file, written straight from the tensors' memory. (safetensors' `save_file` first copies
    every tensor into a bytes object: a second copy of the checkpoint in memory, and its time.)"""
    prepared = {name: t.detach().to("cpu").contiguous() for name, t in tensors.items()}
    names = {t.dtype: SAFETENSORS_NAMES.get(t.dtype) for t in prepared.values()}
    if None in names.values():
        from safetensors.torch import save, save_file

        if into_store.holds(path):
            with into_store.open_object(path) as stream:
                stream.write(save(prepared, metadata={"format": "pt"}))
            return
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
    head = memoryview(struct.pack("<Q", len(text)) + text)
    if into_store.holds(path):  # a remote save's: streamed up (its digest is taken on the way)
        with into_store.open_object(path) as stream:
            for view in (head, *views):
                stream.write(view)
        return
    summer = checksum.Summer(path)
    with open(path, "wb", buffering=0) as handle:
        try:
            _write_all(handle.fileno(), [head, *views], summer)
        except OSError as error:
            raise checksum.named(error, path) from None
    summer.record()


def _write_all(fd: int, views: list, summer=None) -> None:
    """os.writev in calls of at most REQUEST_BYTES and _IOV_MAX buffers, resuming after short writes; `summer`
    digests each batch as it goes out (its bytes are in the cache then)."""
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
        if summer is not None:  # what went out, in order (a short write's rest is digested when it goes)
            left = written
            for view in batch:
                if left <= 0:
                    break
                summer.update(view[:left])
                left -= len(view)
        if written < total:  # short write: put back what did not go out
            rest = []
            for view in batch:
                skip = min(written, len(view))
                written -= skip
                if skip < len(view):
                    rest.append(view[skip:])
            pending[:0] = rest

# -- reading a checkpoint file: prefetched, fast path, or the libraries' own readers -------------------------
def load_object(path: str, load_kwargs: dict | None = None, map_location="cpu", into=None):
    """torch.load with `weights_only=True` unless the caller opted in with `{"weights_only": False}`; a
    torch zip file read safely onto the CPU takes the fast path (`_plan_torch_file`).

    `into(structure)`: given what the file holds (its tensors on the meta device, nothing read yet), an object of
    the same shape (e.g. an optimizer's own `state_dict()`) whose tensors of the same place, dtype and shape
    receive the file's bytes in place instead of fresh memory, or None for fresh memory. As with `load_tensors`,
    an error in the middle leaves such tensors partly loaded."""
    kwargs = dict(load_kwargs or {})
    pending = _take_prefetched(path, "torch", kwargs, map_location) if into is None else None
    if pending is None and _fast_torch_options(kwargs, map_location):
        pending = _plan_torch_file(path, kwargs, into)
        if pending is not None:
            pending.start()
    if pending is not None:
        return pending.result()
    _verify_whole(path)
    return torch_load_safely(path, kwargs, map_location)


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
    if pending is None:
        _verify_whole(path)
    tensors = pending.result() if pending is not None else safetensors_load(path)
    if torch.device(device).type != "cpu":
        tensors = {name: t.to(device) for name, t in tensors.items()}
    return tensors


# -- checksums: which files to verify --------------------------------------------------------------------------
_expected: dict = {}  # absolute path -> checksum spec, while `load_state` reads a checkpoint whose marker has them


class expect_checksums:
    """`with expect_checksums(folder, marker.get("checksums")):` reads of those files verify their bytes."""

    def __init__(self, folder: str, checksums: dict | None):
        self.paths = {}
        for name, spec in (checksums or {}).items():
            if isinstance(spec, dict) and checksum.available(spec.get("algorithm", "")):
                self.paths[os.path.abspath(os.path.join(folder, name))] = spec

    def __enter__(self):
        _expected.update(self.paths)
        return self

    def __exit__(self, *exc):
        for path in self.paths:
            _expected.pop(path, None)


def _spec_for(path: str):
    return _expected.get(os.path.abspath(path)) if _expected else None


def _verify_whole(path: str) -> None:
    """A file read by the libraries' own readers: verified in a pass of its own before they read it."""
    spec = _spec_for(path)
    if spec is not None and os.path.isfile(path):
        checksum.verify_file(path, spec)


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
        if current and (offset < end or offset - end > _GAP_BYTES or len(current) >= _IOV_MAX - 1
                        or offset >= _border(start)):
            flush()
        if current and offset > end:
            current.append(memoryview(bytearray(offset - end)))
            end = offset
        position = 0
        while position < len(view):
            if not current:
                start = end = offset + position
            room = max(min(REQUEST_BYTES - (end - start), _border(start) - end), 0)
            if room == 0 or len(current) >= _IOV_MAX:
                flush()
                continue
            take = min(room, len(view) - position)
            current.append(view[position:position + take])
            position += take
            end += take
    flush()
    return requests


def _border(start: int) -> int:
    """The first checksum chunk border after `start`: a request ends there, so that its thread can verify it."""
    return (start // checksum.CHUNK_BYTES + 1) * checksum.CHUNK_BYTES


def _read_request(read: PendingRead, offset: int, views: list) -> None:
    # The PendingRead travels with the request: its file stays open until the last request is done.
    fd = read.handle.fileno()
    start, original = offset, list(views)
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
    if read.spec is not None:
        read.check_request(start, original)


class PendingRead:
    """A file being read in the background: `result()` waits for it and returns what the file holds.

    Every request reads through the one handle opened when the file was planned, so a checkpoint saved over
    the same path meanwhile (a rename) cannot mix two files' bytes."""

    def __init__(self, path: str, kind: str, handle, requests: list, finish):
        self.path, self.kind, self.handle = path, kind, handle
        self.key = _file_key(path, handle)
        self._requests, self._finish, self._futures = requests, finish, None
        # Checksums (see checkpoint/checksum.py): a request that covers a whole chunk is verified by its own
        # thread; the chunks no single request covers (the file's header, the zip directory, ...) in `result()`.
        self.spec = _spec_for(path)
        self.checked, self.partial = set(), []

    def check_request(self, start: int, views: list) -> None:
        chunk = checksum.CHUNK_BYTES
        index, length = start // chunk, sum(len(v) for v in views)
        if start == index * chunk and start + length == min(start + chunk, self.key[3]):
            checksum.check_chunk(self.path, self.spec, index, views)
            self.checked.add(index)
        else:
            self.partial.append((start, views))

    def _check_the_rest(self) -> None:
        """Verify the chunks no request read whole: what requests read is taken from memory, the rest read here."""
        chunk, size, fd = checksum.CHUNK_BYTES, self.key[3], self.handle.fileno()
        if len(self.spec["digests"]) != checksum.chunk_count(size) or self.spec["chunk"] != chunk:
            raise checksum.mismatch(self.path, 0, size)
        pieces = sorted(self.partial, key=lambda piece: piece[0])
        for index in range(checksum.chunk_count(size)):
            if index in self.checked:
                continue
            position, end, views = index * chunk, min((index + 1) * chunk, size), []
            for start, read_views in pieces:
                if start + sum(len(v) for v in read_views) <= position or start >= end:
                    continue
                if start > position:
                    views.append(os.pread(fd, start - position, position))
                    position = start
                for view in read_views:  # a request lies inside one chunk: all of it is this chunk's
                    views.append(view)
                    position += len(view)
            if position < end:
                views.append(os.pread(fd, end - position, position))
            checksum.check_chunk(self.path, self.spec, index, views)

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
            except (OSError, EOFError, CheckpointError) as failure:
                error = error or failure
        finish, self._finish, self._futures = self._finish, None, None  # the caller owns the memory from here
        try:
            if self.spec is not None and error is None:
                self._check_the_rest()
        finally:
            self.handle.close()
        if isinstance(error, CheckpointError):
            raise error
        if error is not None:
            raise CheckpointError(f"checkpoint file {self.path} is corrupt or truncated ({error})") from None
        return finish()


def _file_key(path: str, handle=None):
    info = os.fstat(handle.fileno()) if handle is not None else os.stat(path)
    return (os.path.abspath(path), info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)


def _target(target, dtype, shape: list, used: "_Used"):
    """The bytes of `target` (an existing tensor, or anything else) as a flat uint8 tensor, where a file's tensor
    of `dtype` and `shape` can be read straight into it; else None."""
    if (not isinstance(target, torch.Tensor) or type(target) is not torch.Tensor or target.device.type != "cpu"
            or target.dtype != dtype or list(target.shape) != shape or not target.is_contiguous()
            or target.requires_grad or target.numel() == 0 or target.is_conj() or target.is_neg()):
        return None
    pointer = target.data_ptr()
    if pointer in used or used.file_backed(pointer):  # tied tensors: read once
        return None
    used.add(pointer)
    return target.reshape(-1).view(torch.uint8)


class _Used(set):
    """The targets one read has taken, and this process's private file mappings (Linux; none known elsewhere). A
    tensor in one (safetensors' `load_file` and `torch.load(mmap=True)` give such tensors, and `assign=True`
    makes them a model's parameters) is not read into: every page written there is first copied from the file
    (read from the disk when cold), so a load would read two checkpoints; its bytes go to fresh memory instead."""

    def __init__(self):
        super().__init__()
        self.ranges = None

    def file_backed(self, pointer: int) -> bool:
        if self.ranges is None:
            self.ranges = _private_file_mappings()
        index = bisect.bisect_right(self.ranges, (pointer, float("inf"))) - 1
        return index >= 0 and self.ranges[index][0] <= pointer < self.ranges[index][1]


def _private_file_mappings() -> list:
    """Sorted (start, end) addresses of this process's private mappings of files."""
    try:
        with open("/proc/self/maps") as maps:
            lines = maps.readlines()
    except OSError:
        return []
    ranges = []
    for line in lines:
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[1].endswith("p") and parts[5].startswith("/"):
            start, _, end = parts[0].partition("-")
            ranges.append((int(start, 16), int(end, 16)))
    return sorted(ranges)


def _plan_safetensors(path: str, into: dict | None = None):
    """A PendingRead (not started) for a safetensors file; None for dtypes the fast reader does not know."""
    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint file {path} is missing")
    handle = open(path, "rb", buffering=0)
    try:
        return _plan_safetensors_from(path, handle, into)
    except BaseException:
        handle.close()
        _verify_whole(path)  # a damaged header: say so by the checksum, when the marker has one
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
    entries, pieces, used, data_end = [], [], _Used(), 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = SAFETENSORS_DTYPES.get(info["dtype"])
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
        target = _target(None if into is None else into.get(name), dtype, shape, used)
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


def _plan_torch_file(path: str, load_kwargs: dict, into=None):
    """A PendingRead (not started) for a torch.save zip file, or None where plain torch.load must do it (legacy
    format, big-endian data, objects other than tensors in plain containers). The structure comes from
    torch.load onto the meta device (the same safe unpickler, no data read), which records where each storage
    lies in the file; the storages are then read in large requests and the tensors rebuilt on them."""
    if not os.path.isfile(path):
        return None  # torch.load names the problem
    handle = open(path, "rb", buffering=0)
    try:
        read = _plan_torch_file_from(path, handle, load_kwargs, into)
    except BaseException:
        handle.close()
        raise
    if read is None:
        handle.close()
    return read


def _plan_torch_file_from(path: str, handle, load_kwargs: dict, into=None):
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
    try:
        structure = torch_load_safely(path, {k: v for k, v in load_kwargs.items() if k != "map_location"},
                                      map_location="meta")
    except Exception:
        _verify_whole(path)  # a damaged pickle: say so by the checksum, when the marker has one
        raise
    if _file_key(path) != _file_key(path, handle):
        return None  # replaced while its structure was read: torch.load reads it whole
    twins = into(structure) if into is not None else None
    buffers, memo, used = {}, {}, _Used()
    sizes = {}

    def rebuild(obj, twin=None):
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
                buffers[offset] = _storage_twin(obj, twin, used)
                if buffers[offset] is None:
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
                    obj[key] = rebuild(obj[key], twin.get(key) if isinstance(twin, dict) else None)
            return obj
        if type(obj) is list:
            if id(obj) not in memo:
                memo[id(obj)] = obj
                obj[:] = [rebuild(item, _item(twin, i)) for i, item in enumerate(obj)]
            return obj
        if type(obj) is tuple:
            return tuple(rebuild(item, _item(twin, i)) for i, item in enumerate(obj))
        if type(obj) in (set, frozenset):
            return type(obj)(rebuild(item) for item in obj)
        raise _NotPlain

    try:
        result = rebuild(structure, twins)
    except _NotPlain:
        return None
    pieces = sorted(buffers.items())

    def finish():
        return result

    return PendingRead(path, "torch", handle, _requests(pieces), finish)


def _item(twin, index: int):
    return twin[index] if isinstance(twin, (list, tuple)) and index < len(twin) else None


def _storage_twin(meta: torch.Tensor, twin, used: "_Used"):
    """The bytes of `twin` as a flat uint8 tensor, where the storage of the file's tensor `meta` can be read
    straight into it: the same dtype and shape, both the whole of their storages, contiguous CPU memory."""
    nbytes = meta.untyped_storage().nbytes()
    if (not isinstance(twin, torch.Tensor) or meta.storage_offset() != 0 or not meta.is_contiguous()
            or meta.numel() * meta.element_size() != nbytes or twin.storage_offset() != 0
            or twin.untyped_storage().nbytes() != nbytes):
        return None
    return _target(twin, meta.dtype, list(meta.shape), used)


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
