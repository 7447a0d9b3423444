"""Durable writes: a file reaches the disk (fsync) before anyone relies on it, a rename replaces a file whole,
and the test hook that kills a save at any of its crash points.

Nothing here knows about the `Accelerator`; `checkpoint/layout.py` decides what goes into which file.
"""

from __future__ import annotations

import json
import os
import shutil
import signal

import torch

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

def remove_tree(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)
