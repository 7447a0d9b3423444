"""Checksums of checkpoint files: computed while a file is written, kept in the completeness marker, verified while
the file is read back.

A file is cut into CHUNK_BYTES pieces at fixed offsets and each piece gets its own digest, so that the reader
threads of `fast_io` (whose requests never cross a piece's border) verify what they read in parallel, while the
bytes are still in the CPU's cache: no second pass over the file, on saving or on loading. The digest is xxh3-64
where the `xxhash` package is installed (about ten times zlib's speed), else zlib's crc32; the marker says which,
and a checkpoint written without checksums (older hasten, Accelerate) is read without them.

The writers here also say "disk full" in one line, naming the file (see `DiskFullError` in `core/errors`), and
hold the test hook `HASTEN_TEST_DISK_FULL_AFTER=N`: a process's writes fail with ENOSPC once N bytes of
checkpoint files went out (documented in docs/checkpointing.md, beside the crash hook).
"""

from __future__ import annotations

import errno
import importlib.util
import os
import threading
import zlib

CHUNK_BYTES = 16 * 2**20
DISK_FULL_ENV = "HASTEN_TEST_DISK_FULL_AFTER"

# xxhash is looked for without importing it: `import hasten` loads no optional library (it is imported at the
# first digest, tests/distributed/test_cluster.py)
_HAS_XXHASH = importlib.util.find_spec("xxhash") is not None
ALGORITHM = "xxh3_64" if _HAS_XXHASH else "crc32"


def available(algorithm: str) -> bool:
    return algorithm == "crc32" or (algorithm == "xxh3_64" and _HAS_XXHASH)


def _xxh3_64():
    import xxhash

    return xxhash.xxh3_64()


class _Running:
    """One chunk's digest, fed in pieces."""

    def __init__(self, algorithm: str):
        self.algorithm = algorithm
        self.state = _xxh3_64() if algorithm == "xxh3_64" else 0

    def update(self, data) -> None:
        if self.algorithm == "xxh3_64":
            self.state.update(data)
        else:
            self.state = zlib.crc32(data, self.state)

    def hexdigest(self) -> str:
        return self.state.hexdigest() if self.algorithm == "xxh3_64" else f"{self.state:08x}"


def digest(views, algorithm: str) -> str:
    running = _Running(algorithm)
    for view in views:
        running.update(view)
    return running.hexdigest()


# -- writing ----------------------------------------------------------------------------------------------------
_written_bytes = [0]  # this process's checkpoint bytes, for the disk-full test hook
_recorded: dict = {}  # absolute path -> checksum spec of files written by this process, until `take`n
_lock = threading.Lock()


class Summer:
    """The chunk digests of a file being written front to back (`update` with each buffer, in order)."""

    def __init__(self, path: str, algorithm: str = ALGORITHM):
        self.path, self.algorithm = path, algorithm
        self.digests, self._running, self._filled = [], None, 0

    def update(self, data) -> None:
        view = memoryview(data).cast("B")
        count_written(self.path, len(view))
        while len(view):
            if self._running is None:
                self._running, self._filled = _Running(self.algorithm), 0
            take = min(CHUNK_BYTES - self._filled, len(view))
            self._running.update(view[:take])
            self._filled += take
            view = view[take:]
            if self._filled == CHUNK_BYTES:
                self.digests.append(self._running.hexdigest())
                self._running = None

    def spec(self) -> dict:
        digests = self.digests + ([self._running.hexdigest()] if self._running is not None else [])
        return {"algorithm": self.algorithm, "chunk": CHUNK_BYTES, "digests": digests}

    def record(self) -> None:
        """Keep the checksum until the commit asks for the files of its folder (`take`)."""
        with _lock:
            _recorded[os.path.abspath(self.path)] = self.spec()


def take(folder: str) -> dict:
    """{path relative to `folder`: spec} of the files under `folder` that this process wrote (and forget them)."""
    prefix = os.path.join(os.path.abspath(folder), "")
    with _lock:
        mine = [path for path in _recorded if path.startswith(prefix)]
        return {os.path.relpath(path, prefix): _recorded.pop(path) for path in mine}


def forget(path: str) -> None:
    with _lock:
        _recorded.pop(os.path.abspath(path), None)


class SummingFile:
    """A binary file object that digests what goes through it (torch.save writes into one)."""

    def __init__(self, handle, path: str):
        self.handle, self.summer, self.error = handle, Summer(path), None

    def write(self, data) -> int:
        try:
            self.summer.update(data)
            return self.handle.write(data)
        except OSError as error:
            # torch.save turns an error raised here into a RuntimeError without the errno: keep it for the caller.
            self.error = named(error, self.summer.path)
            raise

    def flush(self) -> None:
        self.handle.flush()


def named(error: OSError, path: str) -> OSError:
    """`error` with its file name (a failed write() reports none), so the message says which file."""
    if error.filename is None:
        return type(error)(error.errno, error.strerror or str(error), path)
    return error


def count_written(path: str, size: int) -> None:
    """The disk-full test hook: ENOSPC once this process wrote HASTEN_TEST_DISK_FULL_AFTER bytes."""
    limit = os.environ.get(DISK_FULL_ENV)
    if not limit:
        return
    with _lock:
        _written_bytes[0] += size
        over = _written_bytes[0] > int(limit)
    if over:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)


# -- reading ----------------------------------------------------------------------------------------------------
def chunk_count(size: int) -> int:
    return -(-size // CHUNK_BYTES)


def file_chunks(path: str, chunk: int):
    """The bytes of the file `path` in pieces of `chunk` bytes (the last one shorter), read into one buffer that
    each piece reuses: a piece is valid until the next one is asked for."""
    buffer = bytearray(chunk)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as handle:
        while True:
            filled = 0
            while filled < chunk:  # a short read must not move the chunk borders
                count = handle.readinto(view[filled:])
                if not count:
                    break
                filled += count
            if filled:
                yield view[:filled]
            if filled < chunk:
                return


def digest_file(path: str, algorithm: str = ALGORITHM) -> dict:
    """The checksum spec of a file written by someone else (a library's own writer), read front to back."""
    digests = [digest([piece], algorithm) for piece in file_chunks(path, CHUNK_BYTES)]
    return {"algorithm": algorithm, "chunk": CHUNK_BYTES, "digests": digests}


def verify_file(path: str, spec: dict) -> None:
    """Read `path` whole and compare every chunk (for files the fast readers do not read); raises ChecksumError."""
    count, size = 0, 0
    for index, piece in enumerate(file_chunks(path, spec["chunk"])):
        check_chunk(path, spec, index, [piece])
        count, size = index + 1, size + len(piece)
    if count != len(spec["digests"]):
        raise mismatch(path, size, size)


def check_chunk(path: str, spec: dict, index: int, views) -> None:
    expected = spec["digests"][index] if index < len(spec["digests"]) else None
    if expected is None or digest(views, spec["algorithm"]) != expected:
        start = index * spec["chunk"]
        raise mismatch(path, start, start + sum(len(v) for v in views))


def mismatch(path: str, start: int, end: int):
    from ...core.errors import ChecksumError

    return ChecksumError(
        f"checkpoint file {path} is corrupt: bytes {start}-{end} differ from what was written (checksum mismatch: "
        "bit rot or a changed file); load an older checkpoint"
    )
