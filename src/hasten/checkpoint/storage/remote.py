"""Object storage (s3://, gs://, az://, abfs://, memory://, ...) through fsspec: a checkpoint becomes real when its
manifest is written last.

There is no rename on an object store, so a save never writes over a committed checkpoint. Each save of
`<checkpoint>` writes its objects under a version prefix of its own, `<checkpoint>/.v-<token>/`; the commit writes
`<checkpoint>/hasten_checkpoint.json` (every object, size and crc32, and which version holds them) after every
rank confirmed its uploads, then removes the older versions. A reader finds the objects through the manifest, so
it sees the previous checkpoint or the new one, never a mix. What no manifest names (a save that died) is ignored
with one warning and removed by the next save.

Two runs writing to one root would delete each other's versions: each run claims the root (`.hasten_writer.json`:
its run id, host, pid and time, refreshed at every save), and a save finding another run's fresh claim is refused in
one line. A claim older than `claim_ttl` seconds (a run that died) is taken over.

Credentials come from where the store's library looks (environment, profile, instance role); they are never
written into a message. Throttling, 5xx answers and dropped connections are retried with backoff, a bounded number
of times in a bounded time, then reported in one line naming the object.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time

from ...core.errors import CheckpointError, ConfigError
from . import multipart
from .base import MANIFEST_NAME, Storage, Written, crc32_of, with_retries

logger = logging.getLogger(__name__)

CLAIM_NAME = ".hasten_writer.json"
VERSION_TAG = ".v-"
# the library each protocol needs, and the extra that installs it
_LIBRARIES = {"s3": ("s3fs", "s3"), "s3a": ("s3fs", "s3"), "gs": ("gcsfs", "gcs"), "gcs": ("gcsfs", "gcs"),
              "az": ("adlfs", "azure"), "abfs": ("adlfs", "azure"), "abfss": ("adlfs", "azure")}
_TRANSIENT_WORDS = ("SlowDown", "Throttl", "TooManyRequests", "RequestTimeout", "InternalError", "ServiceUnavailable",
                    "503", "500", "502", "504", "reset by peer", "Connection reset", "timed out", "Server disconnected",
                    "reduce your request rate", "Service Unavailable")
_TRANSIENT_STATUS = (429, 500, 502, 503, 504)


def is_transient(error: BaseException) -> bool:
    """Throttling, a 5xx answer or a dropped connection: worth another try."""
    if isinstance(error, (ConnectionError, TimeoutError)):
        return True
    name = type(error).__name__
    if any(word in name for word in ("Timeout", "ConnectionError", "Disconnected", "EndpointConnection")):
        return True
    if _http_status(error) in _TRANSIENT_STATUS:
        return True
    text = str(error)
    return isinstance(error, OSError) and any(word in text for word in _TRANSIENT_WORDS)


def _http_status(error: BaseException):
    """The HTTP status of the answer behind `error` (s3fs raises an OSError whose cause is botocore's ClientError,
    and its text is only the server's message: a 503 SlowDown reads "Please reduce your request rate.")."""
    seen = 0
    while error is not None and seen < 8:
        response = getattr(error, "response", None)
        if isinstance(response, dict):
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if isinstance(status, int):
                return status
        error, seen = error.__cause__ or error.__context__, seen + 1
    return None


def _redacted(url: str) -> str:
    """The URL without user information (`s3://key:secret@bucket/x` -> `s3://bucket/x`)."""
    scheme, sep, rest = url.partition("://")
    if sep and "@" in rest.split("/", 1)[0]:
        rest = rest.split("@", 1)[1]
    return f"{scheme}{sep}{rest}"


def _one_retry_layer(protocol: str, storage_options: dict) -> dict:
    """The options an s3:// filesystem is made with: botocore's own retries off (`total_max_attempts` 1), unless the user
    set them (`AWS_MAX_ATTEMPTS`, or `config_kwargs={"retries": ...}`). botocore retries each request up to 5 times,
    s3fs retries each of its calls 5 times, and hasten retries each object: stacked, a store that stops answering
    held a save for about 5 x 5 x 15 s (s3fs's read timeout) before the one-line error. With two layers a silent
    store ends a save in about 75 s: s3fs's tries of one attempt, after which hasten, past its 60 s, starts no other."""
    if protocol not in ("s3", "s3a") or "AWS_MAX_ATTEMPTS" in os.environ:
        return storage_options
    config = dict(storage_options.get("config_kwargs") or {})
    if "retries" in config:
        return storage_options
    config["retries"] = {"total_max_attempts": 1}  # one try: botocore counts retries in max_attempts
    return {**storage_options, "config_kwargs": config}


class RemoteStorage(Storage):
    def __init__(self, url: str, run_id: str | None = None, claim_ttl: float = 600.0, attempts: int = 5,
                 seconds: float = 60.0, **storage_options):
        protocol = url.split("://", 1)[0].lower()
        try:
            import fsspec
        except ImportError:
            raise ImportError(f"{protocol}:// checkpoints need fsspec: pip install \"hasten[{_extra(protocol)}]\"") from None
        try:
            self.fs, path = fsspec.core.url_to_fs(url, **_one_retry_layer(protocol, storage_options))
        except ImportError:
            library, extra = _LIBRARIES.get(protocol, (f"fsspec's {protocol} implementation", protocol))
            raise ImportError(f"{protocol}:// checkpoints need {library}: pip install \"hasten[{extra}]\"") from None
        except ValueError as error:
            raise ConfigError(f"{_redacted(url)} is not a storage URL hasten can use ({error}); use s3://bucket/path, "
                              "gs://bucket/path, az://container/path, memory://path or a local path") from None
        self.root = _redacted(url).rstrip("/")
        # what must never appear in a message: the URL's user information, and secret-looking storage options
        userinfo = url.partition("://")[2].split("/", 1)[0].rpartition("@")[0]
        self._secrets = [part for part in (userinfo, *userinfo.split(":")) if part] + [
            str(value) for key, value in storage_options.items()
            if isinstance(value, str) and any(word in key.lower() for word in ("key", "secret", "token", "password"))]
        self._base = path.rstrip("/")
        self.run_id = run_id or _run_id()
        self.claim_ttl = claim_ttl
        # a run that resumed from a checkpoint under this root continues the run that wrote it: it takes the
        # claim over (set by the caller; a run still writing there is refused at its own next save)
        self.take_over = False
        self._retry_limits = {"attempts": attempts, "seconds": seconds}
        self.parts_in_flight = 8  # parts of large objects this process uploads at once (set from storage_workers)

    def _full(self, name: str) -> str:
        return f"{self._base}/{name}" if name else self._base

    def _retry(self, action, what: str):
        return with_retries(action, what, is_transient=is_transient, scrub=self._scrub, **self._retry_limits)

    def _lookup(self, action, what: str):
        """`_retry` with twice the attempts (still within the same seconds), for lookups (HEAD requests, listings):
        a HEAD answer has no body, so a throttled one reads as a bare 503 that s3fs does not retry itself, and
        hasten's attempts are all a lookup gets. (Seen: 5 attempts all answered 503 with 30% of requests
        throttled, about 1 lookup in 400.)"""
        limits = {**self._retry_limits, "attempts": 2 * self._retry_limits["attempts"]}
        return with_retries(action, what, is_transient=is_transient, scrub=self._scrub, **limits)

    def _scrub(self, error) -> str:
        """The text of a library's error without any secret this storage was given (libraries repeat the URL)."""
        text = str(error)
        for secret in sorted(self._secrets, key=len, reverse=True):
            text = text.replace(secret, "***")
        return text

    # -- objects ----------------------------------------------------------------------------------------------
    def write(self, name: str, data) -> Written:
        view = memoryview(data).cast("B")
        payload = view.tobytes() if not isinstance(data, bytes) else data
        self._retry(lambda: self.fs.pipe_file(self._full(name), payload), f"upload of {self.url_of(name)}")
        return Written(name, len(payload), crc32_of(payload))

    def upload(self, local_path: str, name: str) -> int:
        """Copy the local file `local_path` to the object `name` (the library streams it: multipart uploads for
        large files, no whole copy in memory); its size."""
        self._retry(lambda: self.fs.put_file(local_path, self._full(name)), f"upload of {self.url_of(name)}")
        return os.path.getsize(local_path)

    def open_writer(self, name: str):
        """A binary file object whose bytes become the object `name` at `close`: written whole when it fits one
        part, else a multipart upload of up to `parts_in_flight` parts at once (`multipart.Upload`)."""
        return multipart.Upload(self, name, multipart.slots(self.parts_in_flight),
                                multipart.parts_for(self.fs, self._full(name)), lambda: self._stream(name))

    def _stream(self, name: str):
        try:
            return self.fs.open(self._full(name), "wb", block_size=multipart.PART_BYTES)
        except Exception as error:  # noqa: BLE001 - one line naming the object, without secrets
            raise CheckpointError(f"upload of {self.url_of(name)} could not start: {type(error).__name__}: "
                                  f"{self._scrub(error)}") from None

    def download(self, name: str, local_path: str) -> None:
        """Copy the object `name` to the local file `local_path` (streamed)."""
        self._retry(lambda: self.fs.get_file(self._full(name), local_path), f"download of {self.url_of(name)}")

    def read(self, name: str, offset: int = 0, length: int | None = None) -> bytes:
        end = None if length is None else offset + length
        return self._retry(lambda: self.fs.cat_file(self._full(name), start=offset or None, end=end),
                           f"download of {self.url_of(name)}")

    def size(self, name: str) -> int:
        return self._lookup(lambda: self.fs.size(self._full(name)), f"size of {self.url_of(name)}")

    def exists(self, name: str) -> bool:
        self._invalidate(name)
        return self._lookup(lambda: self.fs.exists(self._full(name)), f"lookup of {self.url_of(name)}")

    def listdir(self, name: str = "") -> list:
        full = self._full(name)
        self._invalidate(name)
        if not self._lookup(lambda: self.fs.exists(full), f"listing of {self.url_of(name)}"):
            return []
        entries = self._lookup(lambda: self.fs.ls(full, detail=False), f"listing of {self.url_of(name)}")
        return sorted({entry.rstrip("/").rsplit("/", 1)[-1] for entry in entries} - {""})

    def delete(self, name: str) -> None:
        full = self._full(name)
        if self.exists(name):
            self._retry(lambda: self.fs.rm(full, recursive=True), f"removal of {self.url_of(name)}")
        self._invalidate(name)

    def _invalidate(self, name: str) -> None:
        """Forget the library's listing cache, so that what another rank or run wrote is seen."""
        invalidate = getattr(self.fs, "invalidate_cache", None)
        if invalidate is not None:
            invalidate(self._full(name))

    # -- the commit -------------------------------------------------------------------------------------------
    def check_writable(self) -> None:
        """Write and remove a small object under the root: a missing bucket, missing credentials or no write
        permission are said now, in one line, before hours of training are lost."""
        probe = f".hasten_probe-{self.run_id}-{os.getpid()}"
        try:
            self.fs.pipe_file(self._full(probe), b"hasten")
            self.fs.rm(self._full(probe))
        except Exception as error:  # noqa: BLE001 - every failure here becomes one named line
            raise self._refusal(error) from None

    def _refusal(self, error: BaseException) -> Exception:
        where = self.root
        kind, text = type(error).__name__, " ".join(self._scrub(error).split())  # one line (botocore's have several)
        if "NoCredentials" in kind or "Unable to locate credentials" in text or "credentials" in text.lower():
            return CheckpointError(f"no credentials to write checkpoints to {where}: give them where the storage "
                                   "library looks (for s3: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, a profile in "
                                   "AWS_PROFILE, or the machine's instance role)")
        if isinstance(error, FileNotFoundError) or "NoSuchBucket" in text or "does not exist" in text:
            bucket = self._base.split("/", 1)[0]
            return CheckpointError(f"bucket or container {bucket!r} does not exist ({where}); create it or fix the "
                                   "URL")
        if isinstance(error, PermissionError) or "AccessDenied" in text or "Forbidden" in text:
            return CheckpointError(f"no permission to write checkpoints to {where} (the credentials found are not "
                                   "allowed to write there); fix the bucket policy or use other credentials")
        return CheckpointError(f"cannot write checkpoints to {where}: {kind}: {text}")

    def begin(self, checkpoint: str, token: str) -> str:
        self._claim()
        self.clean_uncommitted(checkpoint)
        return f"{checkpoint}/{VERSION_TAG}{token}"

    def commit(self, staging: str, checkpoint: str, manifest: dict) -> None:
        version = staging.rsplit("/", 1)[-1]
        body = json.dumps({**manifest, "objects_under": version}, indent=1, sort_keys=True).encode()
        name = f"{checkpoint}/{MANIFEST_NAME}"
        self._retry(lambda: self.fs.pipe_file(self._full(name), body), f"upload of {self.url_of(name)}")
        for entry in self.listdir(checkpoint):  # the versions the manifest no longer names
            if entry.startswith(VERSION_TAG) and entry != version:
                self.delete(f"{checkpoint}/{entry}")

    def abort(self, staging: str, checkpoint: str) -> None:
        self.delete(staging)

    def resolve(self, checkpoint: str, name: str, manifest: dict | None = None) -> str:
        manifest = manifest or self.manifest(checkpoint)
        if manifest is None:
            raise CheckpointError(f"{self.url_of(checkpoint)} is not a committed checkpoint (no {MANIFEST_NAME}): a "
                                  "save into it did not finish; load an older checkpoint")
        return f"{checkpoint}/{manifest['objects_under']}/{name}"

    def clean_uncommitted(self, checkpoint: str) -> None:
        """Remove what a save that died left under `checkpoint`: versions its manifest does not name (all of
        them when it has none)."""
        manifest = self.manifest(checkpoint)
        keep = None if manifest is None else manifest.get("objects_under")
        for entry in self.listdir(checkpoint):
            if entry != MANIFEST_NAME and entry != keep:
                self.delete(f"{checkpoint}/{entry}")

    def committed(self, parent: str = "") -> list:
        """The committed checkpoints directly under `parent`; an uncommitted one is named in one warning."""
        found, torn = [], []
        for entry in self.listdir(parent):
            if entry.startswith(".") or entry.startswith(VERSION_TAG):
                continue
            name = f"{parent}/{entry}" if parent else entry
            (found if self.is_committed(name) else torn).append(name)
        if torn:
            logger.warning(f"ignoring {len(torn)} uncommitted checkpoint(s) under {self.url_of(parent)} "
                           f"({', '.join(torn)}): a save did not finish; the next save removes them")
        return found

    # -- one run per root -------------------------------------------------------------------------------------
    def _claim(self) -> None:
        now = time.time()
        if self.exists(CLAIM_NAME):
            try:
                claim = json.loads(self.read(CLAIM_NAME))
            except ValueError:
                claim = {}
            other = claim.get("run_id")
            age = now - float(claim.get("time", 0))
            if other and other != self.run_id and age < self.claim_ttl and not self.take_over:
                raise CheckpointError(
                    f"another run ({other}, on {claim.get('host')}, pid {claim.get('pid')}, {age:.0f} s ago) writes "
                    f"checkpoints to {self.root}; two runs there would delete each other's checkpoints: use another "
                    f"project_dir, or remove {self.url_of(CLAIM_NAME)} if that run is gone")
        body = json.dumps({"run_id": self.run_id, "host": socket.gethostname(), "pid": os.getpid(), "time": now})
        self._retry(lambda: self.fs.pipe_file(self._full(CLAIM_NAME), body.encode()),
                    f"upload of {self.url_of(CLAIM_NAME)}")


def _extra(protocol: str) -> str:
    return _LIBRARIES.get(protocol, ("", protocol))[1]


def _run_id() -> str:
    """The job this process belongs to (stable across torchelastic restarts and requeues of the same job)."""
    for name in ("HASTEN_RUN_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"):
        value = os.environ.get(name)
        if value and value != "none":
            return f"{name.lower()}={value}"
    return f"pid={os.getpid()}@{socket.gethostname()}"

