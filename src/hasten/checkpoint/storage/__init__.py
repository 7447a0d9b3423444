"""The storage layer: where checkpoint bytes go, and the commit that makes a checkpoint real.

`storage_for(path_or_url)` gives a `LocalStorage` for a path (or `file://`) and a `RemoteStorage` (fsspec) for an
object-store URL (`s3://`, `gs://`, `az://`, `abfs://`, `memory://`, ...). Both answer the same few operations
(`base.Storage`): write an object, read a range, list, test, delete, and begin/commit/abort a checkpoint; a reader
trusts a checkpoint only when its manifest is there and checks each object against it.

`save_state`/`load_state`/`save_model`/`automatic_resume` reach object stores through it (`checkpoint/
remote_checkpoints.py`: every rank's files streamed into a version prefix, committed by the manifest); local
checkpoints keep `folder.py`'s path, which `LocalStorage` shares. This package is the only one whose code touches a
filesystem or a store for a checkpoint: `folder` (temporary folder, commit, recovery, rotation), `durable` (fsync,
atomic files), `marker`, `checksum`, `fast_io` (parallel tensor files), `safe_load`, `dcp`/`dcp_store` (the reader
and writer every torch.distributed.checkpoint call gets), `into_store` (a remote save's files written straight into
the store), `multipart` (large objects uploaded in parts, several at once, each part retried), `threads`, and `paths`
(what the rest may ask of a local folder).
"""

from __future__ import annotations

from ...core.errors import ConfigError
from .base import MANIFEST_NAME, Storage, Written

_LOCAL_SCHEMES = ("", "file")
# object-store schemes: a path that starts with one of them and a colon but not "://" is a URL typed wrong, which
# would otherwise become a local folder named "s3:" on a disk that dies with the node
_STORE_SCHEMES = ("s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "memory")


def is_remote(path) -> bool:
    """Whether `path` names an object store (a URL with a scheme other than file://). A store URL with a slash
    missing (`s3:/bucket/run`, `s3:bucket`) is refused in one line rather than taken for a local folder."""
    text = str(path)
    if "://" not in text:
        scheme, colon, _ = text.partition(":")
        if colon and scheme.lower() in _STORE_SCHEMES:
            raise ConfigError(f"{text!r} is not a valid {scheme}:// URL (a slash is missing): write "
                              f"{scheme}://bucket/path, or ./{text} for a local folder of that name")
        return False
    scheme = text.split("://", 1)[0].lower()
    return scheme not in _LOCAL_SCHEMES


def storage_for(path, **options) -> Storage:
    """The storage that holds `path`: local for a path or file:// URL, fsspec's for any other URL."""
    if not is_remote(path):
        from .local import LocalStorage

        return LocalStorage(str(path))
    from .remote import RemoteStorage

    return RemoteStorage(str(path), **options)


__all__ = ["MANIFEST_NAME", "Storage", "Written", "is_remote", "storage_for"]
