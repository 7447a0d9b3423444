"""Large objects written front to back and uploaded in parts, several at once, each part retried by the layer.

A writer (torch.save, the safetensors writer, DCP) produces an object as a stream. `Upload` keeps up to one part
(`PART_BYTES`) in memory; an object that ends within it is written whole at `close` (one request, the layer's
retries). A longer one becomes a multipart upload: every full part is handed to the storage's upload threads and
the writer goes on producing the next, so serialising and uploading overlap; at most `parts_in_flight` parts of a
process are in memory or on the wire at once (the storage's bound, `storage_workers`), a writer waiting for a free
slot when they are taken. Each part is one request, retried with backoff by the layer like any other (bounded in
count and time, then one line naming the object). `close` waits for the parts and completes the upload: the object
appears whole or not at all. `discard` aborts it.

Parts grow with the object (PART_BYTES for the first 2000 parts, then twice that for the next 2000, ...), so that
S3's limit of 10000 parts still allows an object of about 1 TB.

Where the store's library offers no part-level calls (only s3fs does, `S3Parts`), the library's own upload stream
is used instead: its parts go one at a time, retried by the library only.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

PART_BYTES = 16 * 2**20  # a part of a multipart upload, and the largest object written in one request
_PARTS_PER_SIZE = 2000  # parts of one size before the part size doubles


def part_bytes(number: int) -> int:
    """The size of part `number` (1-based)."""
    return PART_BYTES << min(6, (number - 1) // _PARTS_PER_SIZE)


class S3Parts:
    """S3's multipart calls through s3fs (`call_s3`), for one object."""

    def __init__(self, fs, full_path: str):
        self.fs = fs
        self.bucket, self.key, _ = fs.split_path(full_path)
        self.upload_id = None

    def start(self) -> None:
        answer = self.fs.call_s3("create_multipart_upload", Bucket=self.bucket, Key=self.key)
        self.upload_id = answer["UploadId"]

    def put(self, number: int, data) -> dict:
        answer = self.fs.call_s3("upload_part", Bucket=self.bucket, Key=self.key, UploadId=self.upload_id,
                                 PartNumber=number, Body=data)
        return {"PartNumber": number, "ETag": answer["ETag"]}

    def finish(self, parts: list) -> None:
        self.fs.call_s3("complete_multipart_upload", Bucket=self.bucket, Key=self.key, UploadId=self.upload_id,
                        MultipartUpload={"Parts": parts})
        self.fs.invalidate_cache(f"{self.bucket}/{self.key}")

    def abort(self) -> None:
        if self.upload_id is not None:
            self.fs.call_s3("abort_multipart_upload", Bucket=self.bucket, Key=self.key, UploadId=self.upload_id)


def parts_for(fs, full_path: str):
    """The part-level calls for `fs`, or None when its library has none hasten knows."""
    if callable(getattr(fs, "call_s3", None)) and callable(getattr(fs, "split_path", None)):
        return S3Parts(fs, full_path)
    return None


class Slots:
    """A process's bound on parts in memory or on the wire, and the threads that upload them."""

    def __init__(self, count: int):
        self.count = max(1, int(count))
        self.free = threading.BoundedSemaphore(self.count)
        self.pool = ThreadPoolExecutor(max_workers=self.count, thread_name_prefix="hasten-upload")


_slots: dict = {}
_slots_lock = threading.Lock()


def slots(count: int) -> Slots:
    """The process's `Slots` for a bound of `count` parts (one set per bound, shared by every storage; a forked
    child, which inherits the parent's without its threads, makes its own)."""
    key = (os.getpid(), count)
    with _slots_lock:
        if key not in _slots:
            _slots[key] = Slots(count)
        return _slots[key]


class Upload:
    """One object written front to back (see the module's text). `storage` gives the retries, the one-line errors
    and, for an object that fits one part, the whole-object write."""

    def __init__(self, storage, name: str, slots: Slots, parts, stream_opener):
        self.storage, self.name, self.slots, self.parts = storage, name, slots, parts
        self.stream_opener = stream_opener  # the library's own upload stream, where `parts` is None
        self.buffer, self.stream = bytearray(), None
        self.number, self.futures, self.started = 0, [], False

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        taken = 0
        while taken < len(view):
            if self.stream is not None:
                self.stream.write(view[taken:])
                break
            size = part_bytes(self.number + 1)
            if len(self.buffer) == size:  # full, and more follows: a part (the last one waits for `close`)
                self._send_part()
                continue
            piece = view[taken:taken + size - len(self.buffer)]
            self.buffer += piece
            taken += len(piece)
        return len(view)

    def _send_part(self) -> None:
        if self.parts is None:  # no part-level calls: the library's stream from here on
            self.stream = self.stream_opener()
            self.stream.write(bytes(self.buffer))
            self.buffer = bytearray()
            return
        self._raise_failed_part()
        if not self.started:
            self.storage._retry(self.parts.start, f"upload of {self.storage.url_of(self.name)}")
            self.started = True
        self.number += 1
        data, number = bytes(self.buffer), self.number
        self.buffer = bytearray()
        self.slots.free.acquire()
        try:
            future = self.slots.pool.submit(self._put, number, data)
        except BaseException:
            self.slots.free.release()
            raise
        self.futures.append(future)

    def _put(self, number: int, data: bytes) -> dict:
        try:
            return self.storage._retry(lambda: self.parts.put(number, data),
                                       f"upload of {self.storage.url_of(self.name)} (part {number})")
        finally:
            self.slots.free.release()

    def _raise_failed_part(self) -> None:
        for future in self.futures:
            if future.done() and future.exception() is not None:
                raise future.exception()

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()
            return
        if not self.started:  # it fit one part: one request
            self.storage.write(self.name, bytes(self.buffer))
            return
        try:
            if self.buffer:
                self._send_part()
            done = [future.result() for future in self.futures]  # the first failed part raises (after its retries)
            self.storage._retry(lambda: self.parts.finish(done), f"upload of {self.storage.url_of(self.name)}")
        except BaseException:
            self.discard()  # the parts that went up are not left in the store
            raise

    def discard(self) -> None:
        self.buffer = bytearray()
        if self.stream is not None:
            discard = getattr(self.stream, "discard", None)
            if discard is not None:
                discard()
            return
        for future in self.futures:  # parts still going up finish (or fail) first, then the upload is aborted
            future.exception()
        self.futures = []
        if self.started:
            self.started = False
            self.storage._retry(self.parts.abort, f"abort of the upload of {self.storage.url_of(self.name)}")
