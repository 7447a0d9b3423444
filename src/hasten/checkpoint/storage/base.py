"""What a checkpoint needs from where it is stored, and the rule that makes a checkpoint real (its manifest).

A `Storage` is rooted at a folder or an object-store prefix (`root`) and addresses objects by names relative to it
(`"checkpoint_3/model.safetensors"`). A checkpoint is written into a *staging* name (`begin`) and becomes real only
by `commit`, which writes its manifest last: every object with its size and checksum. Readers, rotation and resume
trust a checkpoint only when its manifest is there (`is_committed`), and a reader checks each object against it
(`verify`). How the commit is made atomic is the implementation's: a temporary folder and a rename on a local disk
(`local.py`), the manifest written last under the checkpoint's own prefix on an object store (`remote.py`).
"""

from __future__ import annotations

import json
import random
import time
import zlib
from dataclasses import dataclass

from ...core.errors import CheckpointError

MANIFEST_NAME = "hasten_checkpoint.json"  # the completeness marker's name: local and remote checkpoints share it
MANIFEST_FORMAT = "hasten-checkpoint"


@dataclass(frozen=True)
class Written:
    """One object as written: its name (relative to the root), size in bytes and crc32 (8 hex digits)."""

    name: str
    size: int
    crc32: str


def crc32_of(data) -> str:
    return f"{zlib.crc32(data) & 0xFFFFFFFF:08x}"


def manifest_for(written, **fields) -> dict:
    """The manifest of a checkpoint made of `written` objects (names relative to the checkpoint)."""
    return {"format": MANIFEST_FORMAT, "complete": True,
            "files": {w.name: w.size for w in written}, "crc32": {w.name: w.crc32 for w in written}, **fields}


def parse_manifest(text: bytes, where: str) -> dict:
    try:
        manifest = json.loads(text)
    except ValueError as error:
        raise CheckpointError(f"{where} is unreadable ({error}); the checkpoint is damaged") from None
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise CheckpointError(f"{where} is not a hasten checkpoint manifest; the checkpoint is damaged")
    return manifest


class Storage:
    """The operations checkpoints need. Names are '/'-separated and relative to `root`."""

    root: str

    # -- objects ----------------------------------------------------------------------------------------------
    def write(self, name: str, data) -> Written:
        """Write `data` (bytes, or a buffer such as a tensor's memory) as the object `name`, whole or not at all."""
        raise NotImplementedError

    def read(self, name: str, offset: int = 0, length: int | None = None) -> bytes:
        """`length` bytes of `name` from `offset` (to the end when None)."""
        raise NotImplementedError

    def upload(self, local_path: str, name: str) -> int:
        """Copy the local file `local_path` to the object `name`, streamed; its size (a remote save's staged files)."""
        raise NotImplementedError

    def open_writer(self, name: str):
        """A binary file object whose bytes become the object `name` when it is closed (written front to back)."""
        raise NotImplementedError

    def download(self, name: str, local_path: str) -> None:
        """Copy the object `name` to the local file `local_path`, streamed (a remote load)."""
        raise NotImplementedError

    def size(self, name: str) -> int:
        raise NotImplementedError

    def exists(self, name: str) -> bool:
        raise NotImplementedError

    def listdir(self, name: str = "") -> list:
        """The names of the objects and prefixes directly under `name` (relative to it), sorted; [] when none."""
        raise NotImplementedError

    def delete(self, name: str) -> None:
        """Remove the object or the whole prefix `name`; nothing when it is not there."""
        raise NotImplementedError

    # -- the commit -------------------------------------------------------------------------------------------
    def begin(self, checkpoint: str, token: str) -> str:
        """The name to write the checkpoint `checkpoint` into before its commit (every rank gets the same one)."""
        raise NotImplementedError

    def commit(self, staging: str, checkpoint: str, manifest: dict) -> None:
        """Make the checkpoint real: after every rank confirmed its writes, rank 0 writes the manifest last."""
        raise NotImplementedError

    def abort(self, staging: str, checkpoint: str) -> None:
        """Remove what a failed save wrote (the previous checkpoint is untouched)."""
        self.delete(staging)

    # -- what readers trust -----------------------------------------------------------------------------------
    def resolve(self, checkpoint: str, name: str, manifest: dict | None = None) -> str:
        """Where the object `name` of the committed checkpoint `checkpoint` is stored (relative to the root);
        `manifest`: the checkpoint's manifest when the caller has read it already (saves a request per object)."""
        return f"{checkpoint}/{name}"

    def read_object(self, checkpoint: str, name: str) -> bytes:
        """The whole object `name` of a committed checkpoint, checked against its manifest."""
        data = self.read(self.resolve(checkpoint, name))
        self.verify(checkpoint, name, data)
        return data

    def manifest(self, checkpoint: str):
        """The manifest of `checkpoint`, or None when it has none (never committed, or not a hasten checkpoint)."""
        name = f"{checkpoint}/{MANIFEST_NAME}"
        if not self.exists(name):
            return None
        return parse_manifest(self.read(name), self.url_of(name))

    def is_committed(self, checkpoint: str) -> bool:
        manifest = self.manifest(checkpoint)
        return manifest is not None and bool(manifest.get("complete"))

    def verify(self, checkpoint: str, name: str, data: bytes) -> None:
        """Check an object read back against the manifest: its size and crc32; one line naming it otherwise."""
        manifest = self.manifest(checkpoint) or {}
        size, crc = manifest.get("files", {}).get(name), manifest.get("crc32", {}).get(name)
        where = self.url_of(f"{checkpoint}/{name}")
        if size is not None and len(data) != size:
            raise CheckpointError(f"checkpoint object {where} has {len(data)} bytes but {size} were written: it is "
                                  "truncated or corrupt; load an older checkpoint")
        if crc is not None and crc32_of(data) != crc:
            raise CheckpointError(f"checkpoint object {where} does not match its checksum (crc32 {crc32_of(data)}, "
                                  f"written {crc}): its bytes changed after the commit; load an older checkpoint")

    def url_of(self, name: str) -> str:
        return f"{self.root.rstrip('/')}/{name}" if name else self.root


def with_retries(action, what: str, *, is_transient, attempts: int = 5, seconds: float = 60.0, base: float = 0.2,
                 sleep=time.sleep, scrub=str):
    """Run `action()`, again after a transient failure (`is_transient(error)`: throttling, a 5xx, a dropped
    connection), with exponential backoff and jitter, at most `attempts` times and `seconds` in all; then one line
    naming `what` (`scrub(error)` is the error's text with any secret taken out). Other errors go up at once."""
    started = time.monotonic()
    for attempt in range(1, attempts + 1):
        try:
            return action()
        except Exception as error:  # noqa: BLE001 - sorted right here: transient ones are retried, others re-raised
            if not is_transient(error):
                raise
            waited = time.monotonic() - started
            if attempt == attempts or waited >= seconds:
                raise CheckpointError(f"{what} failed {attempt} time(s) in {waited:.1f} s, last: "
                                      f"{type(error).__name__}: {scrub(error)}; the storage did not recover (the "
                                      "checkpoint was not committed)") from None
            sleep(min(base * 2 ** (attempt - 1), 5.0) * (0.5 + random.random()))
