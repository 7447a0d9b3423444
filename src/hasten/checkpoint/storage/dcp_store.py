"""DCP folders in object storage: `StoreReader` (torch's file reader over the layer's `Storage`) with `CheckedObject`
(a stream that hands on only bytes checked against the manifest), and `StoreWriter` (torch's file writer streaming
each file up, digested as it goes). See `dcp.py`."""

from __future__ import annotations

import io
from contextlib import contextmanager

from torch.distributed.checkpoint.filesystem import FileSystemBase, FileSystemReader, FileSystemWriter

from ...core.errors import CheckpointError, ChecksumError
from . import checksum, into_store

_KEEP_CHUNKS = 3  # verified chunks a stream keeps: the one being read, and the (up to two) where its item ends


class _InStore(FileSystemBase):
    """What DCP's file system interface means in a `Storage`: names are '/'-joined object names, used as given."""

    def concat_path(self, path, suffix: str):
        return f"{str(path).rstrip('/')}/{suffix}"

    def init_path(self, path, **kwargs):
        return str(path)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return False  # chosen by the layer (`dcp.py`), never by DCP from a checkpoint id


class StoreFiles(_InStore):
    """DCP's view of a folder in a `Storage`: read only, every read checked (`CheckedObject`)."""

    def __init__(self, storage, files: dict):
        self.storage, self.files = storage, files

    @contextmanager
    def create_stream(self, path, mode: str):
        if "r" not in mode or "+" in mode:
            raise CheckpointError(f"{self.storage.url_of(str(path))} is part of a committed checkpoint: read only")
        path = str(path)
        size, spec = self.files.get(path.rsplit("/", 1)[-1], (None, None))
        if size is None:
            size = self.storage.size(path)
        yield CheckedObject(self.storage, path, size, spec)

    def rename(self, path, new_path=None) -> None:
        raise CheckpointError("a committed checkpoint in object storage is read only")

    mkdir = rm_file = rename

    def exists(self, path) -> bool:
        return self.storage.exists(str(path))


class StoreReader(FileSystemReader):
    """torch's file reader over `StoreFiles`: DCP's own planning and deserialisation, the layer's bytes."""

    def __init__(self, storage, name: str, files: dict):
        super().__init__(name)
        self.fs = StoreFiles(storage, files)
        self.path = name

    def reset(self, checkpoint_id=None) -> None:
        super().reset(None)  # the folder is fixed: the store's copy of this checkpoint


class CheckedObject(io.RawIOBase):
    """A seekable binary stream over one object in a `Storage`, read in whole checksum chunks (one ranged request
    each), every chunk compared with the manifest's digest before any byte of it is handed on; an object without
    a digest (a checkpoint written before hasten kept them) is checked for its size only."""

    def __init__(self, storage, name: str, size: int, spec: dict | None):
        super().__init__()
        usable = spec is not None and checksum.available(spec.get("algorithm", ""))
        self.storage, self.name, self.size, self.spec = storage, name, int(size), spec if usable else None
        self.chunk = int(self.spec["chunk"]) if self.spec else checksum.CHUNK_BYTES
        self.position = 0
        self.chunks: dict = {}

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.size}[whence]
        self.position = max(0, base + offset)
        return self.position

    def readinto(self, buffer) -> int:
        view = memoryview(buffer).cast("B")
        end = min(self.position + len(view), self.size)
        filled = 0
        while self.position < end:
            index, within = divmod(self.position, self.chunk)
            data = self._chunk_at(index)
            take = min(len(data) - within, end - self.position)
            view[filled:filled + take] = data[within:within + take]
            filled += take
            self.position += take
        return filled

    def _chunk_at(self, index: int) -> bytes:
        data = self.chunks.get(index)
        if data is not None:
            return data
        start = index * self.chunk
        wanted = min(self.chunk, self.size - start)
        data = self.storage.read(self.name, start, wanted)
        where = self.storage.url_of(self.name)
        if len(data) != wanted:
            raise ChecksumError(f"checkpoint object {where} is shorter than the {self.size} bytes written (bytes "
                                f"{start}-{start + wanted} missing): it is truncated; load an older checkpoint")
        if self.spec is not None:
            checksum.check_chunk(where, self.spec, index, [data])
        self.chunks[index] = data
        while len(self.chunks) > _KEEP_CHUNKS:  # keep the highest: torch.load reads an item's end (its zip
            del self.chunks[min(i for i in self.chunks if i != index)]  # directory) first, then its data in order
        return data


# -- writing a DCP folder straight into the store -----------------------------------------------------------------
class StoreWriteFiles(_InStore):
    """DCP's view of a save's folder in a `Storage`: each data file streamed up as it is written (`into_store`'s
    digesting stream); the metadata, which DCP writes under a temporary name and renames, kept in memory and written
    once under its own name. What this process wrote is recorded in `save` under `relative`."""

    def __init__(self, save, folder: str, relative: str):
        self.storage, self.save, self.folder, self.relative = save.storage, save, folder, relative
        self.pending: dict = {}
        self.failure = None  # (object URL, the store library's error) of the first upload that failed

    def _record(self, name: str, size: int, spec: dict) -> None:
        self.save.record(f"{self.relative}/{name.rsplit('/', 1)[-1]}", size, spec)

    @contextmanager
    def create_stream(self, path, mode: str):
        path = str(path)
        if "w" not in mode:
            raise CheckpointError(f"{self.storage.url_of(path)}: a checkpoint being written is not read back")
        if path.endswith(".tmp"):  # the metadata: small, renamed right after
            buffer = io.BytesIO()
            yield buffer
            self.pending[path] = buffer.getvalue()
            return
        try:
            with into_store.upload_stream(self.storage, path,
                                          lambda size, spec: self._record(path, size, spec)) as stream:
                yield stream
        except BaseException as error:  # kept for `failure_message`: DCP gathers it behind its own exception
            self.failure = self.failure or (self.storage.url_of(path), error)
            raise

    def failure_message(self):
        """One line for the first failed upload (None when none failed), without any secret the storage holds."""
        if self.failure is None:
            return None
        return str(into_store.said(self.storage, *self.failure))

    def rename(self, path, new_path) -> None:
        data = self.pending.pop(str(path))
        self.storage.write(str(new_path), data)
        summer = checksum.Summer(self.storage.url_of(str(new_path)))
        summer.update(data)
        self._record(str(new_path), len(data), summer.spec())

    def mkdir(self, path) -> None:
        pass  # a store has no folders

    def exists(self, path) -> bool:
        return False  # a save writes into a version prefix of its own, new for every save: nothing is there yet

    def rm_file(self, path) -> None:
        pass  # see `exists`


class StoreWriter(FileSystemWriter):
    """torch's file writer over `StoreWriteFiles`: DCP's own planning and serialisation, the layer's store; the
    save's `threads` files per process at once (one upload stream each)."""

    def __init__(self, save, relative: str):
        folder = f"{save.prefix}/{relative}"
        super().__init__(folder, sync_files=False, thread_count=save.threads)
        self.fs = StoreWriteFiles(save, folder, relative)
        self.path = folder

    def reset(self, checkpoint_id=None) -> None:
        super().reset(None)  # the folder is fixed: this save's version prefix
