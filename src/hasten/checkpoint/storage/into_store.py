"""A remote save's files written straight into the store, not staged on the local disk.

A save to object storage writes into a local folder of its own (`layout.py` names it, and every backend writes
"into" it), but while that folder is registered here (`write_into`, for as long as the save's version prefix is
open) a file that hasten's own writers create under it becomes an object under the prefix instead: `durable`'s
`save_object` (torch.save), `fast_io`'s `save_tensors` (safetensors) and DCP's files (`dcp.py`) open it with
`open_object` and stream their bytes up as they produce them. Each stream is digested on the way out
(`checksum.Summer`, the chunks the manifest keeps) and, once the store has it whole, recorded with its size; the
commit takes those (`stop_writing_into`) and uploads nothing twice. A writer that fails abandons its stream: no
object appears (an unfinished multipart upload is aborted) and nothing is recorded.

What other code writes into the folder (a save hook, DeepSpeed's engine) lands on the local disk as before and is
uploaded at the commit.
"""

from __future__ import annotations

import io
import logging
import os
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field

from . import checksum

logger = logging.getLogger(__name__)
STORED = "stored"  # in a checksum spec reported to the commit: the file is in the store already (its size)


@dataclass
class Save:
    """One save's place in the store: `prefix` in `storage`, `threads` files at once (DCP), and what went up."""

    storage: object
    prefix: str
    threads: int = 1
    written: dict = field(default_factory=dict)  # {file relative to the save's folder: (size, checksum spec)}
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, relative: str, size: int, spec: dict) -> None:
        with self.lock:
            self.written[relative] = (size, spec)


_saves: dict = {}  # absolute local folder of a save -> Save


def write_into(local_folder: str, storage, prefix: str, threads: int = 1) -> None:
    """Files hasten writes under `local_folder` go to `prefix` in `storage` instead (a remote save's version
    prefix); DCP writes `threads` files at once."""
    _saves[os.path.abspath(local_folder)] = Save(storage, prefix, max(1, int(threads)))


def stop_writing_into(local_folder: str) -> dict:
    """{file relative to the save's folder: (size, checksum spec)} this process wrote into the store for it."""
    save = _saves.pop(os.path.abspath(local_folder), None)
    return {} if save is None else dict(save.written)


def place_of(path: str):
    """(Save, the path relative to the save's folder, '/'-separated) when `path` goes into the store; else None."""
    path = os.path.abspath(path)
    for folder, save in list(_saves.items()):
        if path.startswith(os.path.join(folder, "")):
            return save, os.path.relpath(path, folder).replace(os.sep, "/")
    return None


def holds(path: str) -> bool:
    return place_of(path) is not None


def size_written(path: str):
    """The size of the object `path` became (None: it is not in the store, or not written yet)."""
    place = place_of(path)
    if place is None:
        return None
    save, relative = place
    with save.lock:
        entry = save.written.get(relative)
    return None if entry is None else entry[0]


@contextmanager
def open_object(path: str):
    """`with open_object(path) as handle:` a binary file object whose bytes become the object for `path` (which
    `holds`); recorded when the block ends and the store has it, abandoned when the block raises."""
    save, relative = place_of(path)
    with upload_stream(save.storage, f"{save.prefix}/{relative}",
                       lambda size, spec: save.record(relative, size, spec)) as stream:
        yield stream


@contextmanager
def upload_stream(storage, name: str, record):
    """`with upload_stream(storage, name, record) as handle:` the digesting stream (`Summing`) of the object `name`
    in `storage`; when the block ends the upload completes and `record(size, checksum spec)` is called; when the
    block or the completion fails the upload is abandoned and its failure raised in one line naming the object."""
    where = storage.url_of(name)
    raw = storage.open_writer(name)
    stream = Summing(raw, where)
    try:
        yield stream
    except BaseException as error:
        abandon(raw, where)
        if stream.failure is None or error is stream.failure:
            raise
        raise said(storage, where, stream.failure) from error  # torch.save hid it behind "unexpected pos"
    try:
        raw.close()  # the last part goes up and the object appears; a failure here fails the save
    except Exception as error:
        abandon(raw, where)
        raise said(storage, where, error) from error
    record(stream.position, stream.summer.spec())


def said(storage, where: str, error: BaseException):
    """A failed upload as one line naming the object (the layer's own line when it is one already), without any
    secret the storage holds."""
    from ...core.errors import CheckpointError

    if isinstance(error, CheckpointError) and where in str(error):
        return error
    scrub = getattr(storage, "_scrub", str)
    return CheckpointError(f"upload of {where} failed: {type(error).__name__}: {' '.join(scrub(error).split())}")


class Summing(io.RawIOBase):
    """What a writer writes one object through: the bytes go on to `raw` (the store's upload stream) and are
    digested on the way (`checksum.Summer`); `tell` counts them, as torch's zip writer needs. `flush` is not passed
    on (a store cannot take parts smaller than its minimum; the upload stream sends a part when one is full)."""

    def __init__(self, raw, name: str):
        super().__init__()
        self.raw, self.summer, self.position, self.failure = raw, checksum.Summer(name), 0, None

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        self.summer.update(view)
        try:
            self.raw.write(view)
        except Exception as error:  # torch.save's zip writer hides it behind "unexpected pos": kept for the message
            self.failure = self.failure or error
            raise
        self.position += len(view)
        return len(view)

    def tell(self) -> int:
        return self.position

    def flush(self) -> None:
        pass


def abandon(raw, where: str) -> None:
    """An upload stream whose writer failed: the unfinished upload is discarded, not completed (the save is not
    committed either way; this only spares the store the parts)."""
    try:
        discard = getattr(raw, "discard", None)
        if discard is not None:
            discard()
        else:
            raw.close()
    except Exception as error:  # noqa: BLE001 - the writer's own error is the one raised
        logger.warning(f"could not abandon the upload of {where} after a failed save ({type(error).__name__}: {error})")
