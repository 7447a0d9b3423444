"""Durable writes: a file reaches the disk (fsync) before anyone relies on it, a rename replaces a file whole,
and the test hook that kills a save at any of its crash points.

Nothing here knows about the `Accelerator`; `checkpoint/layout.py` decides what goes into which file.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal

import torch

from . import checksum, into_store

# Temporary and replaced folders are hidden (leading dot) and carry these tags, so neither automatic
# naming nor `load_state()` can take one for a checkpoint.
TEMP_TAG = ".hasten-tmp-"
OLD_TAG = ".hasten-old-"

# Test hook (documented in docs/checkpointing.md): with HASTEN_TEST_CRASH_AT=N the process SIGKILLs itself at
# the N-th crash point of its saves; HASTEN_TEST_CRASH_RANK limits it to one rank. Crash points sit before each
# file, in the middle of it (the file is cut to half its size first) and after it, and between commit steps.
# HASTEN_TEST_CRASH_SIGNAL=SIGSTOP freezes the process there instead (a node that hangs without dying).
CRASH_ENV = "HASTEN_TEST_CRASH_AT"
CRASH_RANK_ENV = "HASTEN_TEST_CRASH_RANK"
CRASH_SIGNAL_ENV = "HASTEN_TEST_CRASH_SIGNAL"
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
    os.kill(os.getpid(), getattr(signal, os.environ.get(CRASH_SIGNAL_ENV) or "SIGKILL"))

# -- durable writes ---------------------------------------------------------------------------------------------
def fsync_file(path: str) -> None:
    try:
        with open(path, "rb") as handle:
            os.fsync(handle.fileno())
    except OSError as error:  # a file system that allocates late reports a full disk here
        raise disk_full(checksum.named(error, path)) if error.errno == errno.ENOSPC else error from None


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
    try:
        writer(path)
    except OSError as error:
        if error.errno == errno.ENOSPC:
            raise disk_full(checksum.named(error, path)) from None
        raise
    stored = into_store.size_written(path)
    if stored is not None:  # an object in the store (a remote save): it is whole once its writer returned; the
        crash_point(rank)  # two crash points after a local file are kept, so HASTEN_TEST_CRASH_AT counts the same
        crash_point(rank)
        return stored
    crash_point(rank, partial_file=path)
    if sync:
        fsync_file(path)
    crash_point(rank)
    return os.path.getsize(path)

def disk_full(error: OSError):
    """The one-line error of a write that found the disk full (the caller adds what the whole save needs)."""
    from ...core.errors import DiskFullError

    path = error.filename
    free = _free_bytes(os.path.dirname(path) if path else ".")
    return DiskFullError(f"no space left on the device writing {path} ({free} bytes free there)")


def _free_bytes(folder: str):
    try:
        info = os.statvfs(folder)
    except OSError:
        return "unknown"
    return info.f_bavail * info.f_frsize


def save_object(obj, path: str) -> None:
    """torch.save, with the file's checksums taken from the bytes as they go out (kept for the marker); straight
    into the store when `path` is a remote save's (`into_store`)."""
    if into_store.holds(path):
        with into_store.open_object(path) as stream:
            torch.save(obj, stream)
        return
    with open(path, "wb") as handle:
        summing = checksum.SummingFile(handle, path)
        try:
            torch.save(obj, summing)
        except RuntimeError:
            if summing.error is not None:  # torch hides the OSError of a failed write behind a RuntimeError
                raise summing.error from None
            raise
    summing.summer.record()


def save_json(obj, path: str) -> None:
    text = json.dumps(obj, indent=2, sort_keys=True) + "\n"
    try:
        checksum.count_written(path, len(text))
        with open(path, "w") as handle:
            handle.write(text)
    except OSError as error:
        raise checksum.named(error, path) from None


def atomic_write(path: str, writer) -> None:
    """Write through a hidden sibling and rename it over `path`: readers see the old file or the new one."""
    folder, name = os.path.split(os.path.abspath(path))
    temp = os.path.join(folder, f".{name}{TEMP_TAG}{os.getpid()}")
    try:
        writer(temp)
        fsync_file(temp)
        os.replace(temp, path)
    finally:
        checksum.forget(temp)
        if os.path.exists(temp):
            os.remove(temp)
    fsync_dir(folder)

def remove_tree(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)
