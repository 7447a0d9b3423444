"""A local (or mounted network) filesystem: today's checkpoints, through the storage layer.

Objects are files under `root`; the commit is the one `checkpoint/folder.py` has always made (a hidden temporary
folder, fsync, the completeness marker, a rename), so a checkpoint written through this class is byte for byte
one that `save_state` writes, and the same readers load it.
"""

from __future__ import annotations

import os

from . import durable
from . import folder as folders
from .base import Storage, Written, crc32_of


class LocalStorage(Storage):
    def __init__(self, root: str):
        if root.startswith("file://"):
            root = root[len("file://"):]
        self.root = os.path.abspath(os.path.expanduser(root))

    def path(self, name: str) -> str:
        return os.path.join(self.root, *name.split("/")) if name else self.root

    # -- objects ----------------------------------------------------------------------------------------------
    def write(self, name: str, data) -> Written:
        path = self.path(name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        view = memoryview(data).cast("B")

        def writer(target):
            with open(target, "wb") as handle:
                handle.write(view)

        size = durable.write_file(path, writer, sync=False)  # the commit fsyncs the whole folder
        return Written(name, size, crc32_of(view))

    def read(self, name: str, offset: int = 0, length: int | None = None) -> bytes:
        with open(self.path(name), "rb") as handle:
            handle.seek(offset)
            return handle.read() if length is None else handle.read(length)

    def size(self, name: str) -> int:
        return os.path.getsize(self.path(name))

    def exists(self, name: str) -> bool:
        return os.path.exists(self.path(name))

    def listdir(self, name: str = "") -> list:
        path = self.path(name)
        return sorted(os.listdir(path)) if os.path.isdir(path) else []

    def delete(self, name: str) -> None:
        path = self.path(name)
        if os.path.isdir(path):
            durable.remove_tree(path)
        elif os.path.exists(path):
            os.remove(path)

    # -- the commit -------------------------------------------------------------------------------------------
    def begin(self, checkpoint: str, token: str) -> str:
        temp = folders.prepare_target(self.path(checkpoint), automatic=False, token=token)
        return os.path.relpath(temp, self.root).replace(os.sep, "/")

    def commit(self, staging: str, checkpoint: str, manifest: dict) -> None:
        temp = self.path(staging)
        durable.fsync_tree(temp)
        extra = {k: v for k, v in manifest.items() if k not in ("format", "complete", "files", "iteration",
                                                                 "num_processes", "checksums")}
        folders.commit(temp, self.path(checkpoint), manifest.get("files", {}), manifest.get("iteration"),
                       manifest.get("num_processes", 1), rank=0, checksums=manifest.get("checksums"), extra=extra)
