"""torch.distributed.checkpoint's folders (FSDP, tensor and pipeline parallelism) through the storage layer.

DCP writes and reads its own files, through a `StorageWriter`/`StorageReader`; the backends get theirs here and
call `save`/`async_save`/`load` below instead of handing DCP a path. A folder on a local disk gets torch's own
`FileSystemWriter`/`FileSystemReader`, exactly what DCP picks for a path, at its speed (the commit digests what
they wrote, `engine_checksums.py`).

A save to object storage whose version prefix is open when DCP runs (`into_store.write_into`: every synchronous save, and the
first asynchronous one to a root) writes its DCP folders straight into the store (`StoreWriter`): every process
streams its own shard files up (the store library's multipart uploads, `storage_workers` files at once), digesting
the bytes as they go out, and nothing of the sharded state is staged on the local disk; the files are reported to
the commit with their sizes and checksums (`into_store.stop_writing_into`). An asynchronous save whose prefix is opened in the
background stages its DCP folders like its other files.

A sharded folder of a checkpoint fetched from object storage stays in the
store (`remote_checkpoints.fetch` registers it with `stream_from`): `StoreReader` reads there, each process the
byte ranges of its own shards, through the checkpoint's `Storage` (its retries and one-line errors), in whole
checksum chunks, each compared with the digest the manifest holds before DCP sees a byte of it. A byte changed in
the store is a `ChecksumError` naming the object, on every process (DCP gathers a reader's failure to all ranks),
not a silently wrong weight.
"""

from __future__ import annotations

import contextlib
import os

from ...core.errors import CheckpointError, ChecksumError
from . import into_store

_streamed: dict = {}  # absolute local folder -> (storage, name of the folder in it, {file: (size, spec or None)})


def stream_from(local_folder: str, storage, name: str, files: dict) -> None:
    """Read the DCP folder `local_folder` from `name` in `storage` instead; `files`: {file in the folder: (size,
    checksum spec or None)}, from the checkpoint's manifest."""
    _streamed[os.path.abspath(local_folder)] = (storage, name, dict(files))


def stop_streaming_under(local: str) -> None:
    prefix = os.path.join(os.path.abspath(local), "")
    for folder in [f for f in _streamed if f.startswith(prefix)]:
        del _streamed[folder]


def writer(path: str):
    place = into_store.place_of(path)
    if place is not None:  # a remote save whose version prefix is open: straight into the store
        from .dcp_store import StoreWriter

        os.makedirs(path, exist_ok=True)  # empty: the local bookkeeping of the save sees the folder
        return StoreWriter(*place)
    from torch.distributed.checkpoint import FileSystemWriter

    return FileSystemWriter(path)


def reader(path: str):
    entry = _streamed.get(os.path.abspath(path))
    if entry is None:
        from torch.distributed.checkpoint import FileSystemReader

        return FileSystemReader(path)
    from .dcp_store import StoreReader

    return StoreReader(*entry)


def save(state: dict, path: str, **options) -> None:
    import torch.distributed.checkpoint as dcp

    target = writer(path)
    with _uploads_said(target):
        dcp.save(state, storage_writer=target, checkpoint_id=path, **options)


def async_save(state: dict, path: str, **options):
    """DCP's asynchronous save; its `result()` raises as `save` does."""
    import torch.distributed.checkpoint as dcp

    target = writer(path)
    return _Pending(dcp.async_save(state, storage_writer=target, checkpoint_id=path, **options), target)


class _Pending:
    """DCP's future, whose `result()` says a failed upload in one line."""

    def __init__(self, future, target):
        self.future, self.target = future, target

    def result(self):
        with _uploads_said(self.target):
            return self.future.result()


@contextlib.contextmanager
def _uploads_said(target):
    """A save into the store that failed: its one line (the upload that failed, this rank's or, gathered by DCP,
    another's), instead of DCP's exception with every rank's traceback. Any other failure goes up as it was."""
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException: DCP's gathered failures

    try:
        yield
    except (CheckpointException, Exception) as error:
        failure_message = getattr(target.fs, "failure_message", None)  # None: a local folder, torch's writer
        said = None if failure_message is None else failure_message() or _inner_failure(error, CheckpointError)
        if said is None:
            raise
        raise CheckpointError(said) from error


def load(state: dict, path: str, **options) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    streamed = os.path.abspath(path) in _streamed
    try:
        dcp.load(state, storage_reader=reader(path), **options)
    except CheckpointException as error:  # a reader's failure on any rank, gathered to all: a damaged object is said
        found = _inner_failure(error, ChecksumError) if streamed else None
        if found is None:
            raise
        raise ChecksumError(found) from None


def _inner_failure(error: BaseException, kind):
    """The message of the first `kind` error inside DCP's CheckpointException (the failures of every rank), if any."""
    failures = getattr(error, "failures", None) or {}
    for _, failure in sorted(failures.items()):
        inner = failure[0] if isinstance(failure, tuple) else failure
        if isinstance(inner, kind):
            return str(inner)
    return None
