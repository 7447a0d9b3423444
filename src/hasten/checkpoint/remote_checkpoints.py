"""`save_state` / `load_state` / `save_model` to and from object storage (s3://, gs://, az://, memory://, ...).

A save to a URL is the local save, staged: every process writes its files exactly as for a local checkpoint, into a
hidden folder under the staging root on its own machine (`HASTEN_STAGING_DIR`, else the temporary directory), so
every backend's writer (safetensors, torch.save, DCP shards, DeepSpeed's engine) runs unchanged. Then, instead of the
local rename, every process uploads files in parallel (each file by one process that wrote it: sharded
checkpoints upload from every rank at once), everybody reports, and rank 0 writes the manifest last
(`storage/remote.py`: every object with its size and the chunk checksums the writers took). Rotation deletes an old
checkpoint only after the new one is committed. A load downloads the committed objects (in parallel, on each
machine's first process) into a local folder with a complete marker, and the local reader loads it, verifying each
chunk as it comes in; the copy is removed afterwards.

The layout code (`layout.py`) calls in at three points: where a save starts (`start_save`), where it commits
(`publish`) and where a load resolves its input (`fetch`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ..core import env
from ..core.errors import CheckpointError, ConfigError
from ..distributed import control
from . import durable
from . import folder as folders
from .storage import is_remote, storage_for
from .storage.remote import _redacted

logger = logging.getLogger(__name__)

STAGING_ENV = "HASTEN_STAGING_DIR"
WORKERS_ENV = "HASTEN_STORAGE_WORKERS"
_checked: set = set()  # roots this process has shown to be writable


def staging_root() -> str:
    """Where a process stages a remote checkpoint on its own machine."""
    return os.path.expanduser(os.environ.get(STAGING_ENV) or os.path.join(tempfile.gettempdir(),
                                                                          f"hasten-staging-{os.getuid()}"))


def workers() -> int:
    """How many transfers one process runs at once (bounded: each is one request stream)."""
    return max(1, env.get_int_from_env([WORKERS_ENV], 8))


def join(root: str, *names: str) -> str:
    return "/".join([root.rstrip("/"), *[n.strip("/") for n in names if n]])


def _split(url: str):
    parent, _, name = url.rstrip("/").rpartition("/")
    if not name or not parent.partition("://")[2]:  # s3://bucket alone names no checkpoint inside it
        raise ConfigError(f"{url} names no checkpoint inside a bucket: use s3://bucket/path/checkpoint_name")
    return parent, name


def _key(url: str) -> str:
    return hashlib.sha1(url.encode()).hexdigest()[:16]


def _storage(parent: str):
    return storage_for(parent)


@dataclass(frozen=True)
class RemoteTarget:
    """One save's destination: the checkpoint `name` under `parent`, staged locally at `local_target`."""

    url: str
    parent: str
    name: str
    local_target: str
    staging: str  # the version prefix every rank uploads into (relative to `parent`)


def start_save(url: str, automatic: bool, broadcast, rank: int) -> RemoteTarget:
    """On every process: rank 0 checks the store (once per root: bucket, credentials, permission), claims the root
    for this run, clears what a dead save left and opens a version prefix; everybody learns the outcome."""
    parent, name = _split(url)
    token = broadcast(uuid.uuid4().hex[:12])
    outcome = None
    if rank == 0:
        try:
            storage = _storage(parent)
            if parent not in _checked:
                storage.check_writable()
                _checked.add(parent)
            if automatic and storage.is_committed(name):
                raise ConfigError(f"checkpoint {url} already exists; set accelerator.project_configuration.iteration "
                                  "past it, or call load_state() first (hasten then continues the numbering)")
            outcome = ("ok", storage.begin(name, token))
        except (CheckpointError, ConfigError) as error:
            outcome = (type(error).__name__, str(error))
        except Exception as error:  # noqa: BLE001 - any other failure too, or the other ranks wait in the broadcast
            outcome = ("CheckpointError", f"save_state({_redacted(url)}) could not start on the storage: "
                                          f"{type(error).__name__}: {error}")
    outcome = broadcast(outcome)
    if outcome[0] == "ConfigError":
        raise ConfigError(outcome[1])
    if outcome[0] != "ok":
        raise CheckpointError(outcome[1])
    local = os.path.join(staging_root(), _key(parent), name)
    return RemoteTarget(url.rstrip("/"), parent, name, local, outcome[1])


def check_project_store(project, rank: int) -> None:
    """At `prepare()`, when the project directory is a URL: rank 0 writes and removes a probe where the checkpoints
    will go (a missing bucket, missing credentials, no write permission, a bad URL), every rank learns the outcome,
    and the same one line is raised on every rank, before any training is done. Once per root and process."""
    if project.project_dir is None or not is_remote(project.project_dir):
        return
    root = folders.checkpoints_root(project) if project.automatic_checkpoint_naming else str(project.project_dir)
    outcome = None
    if rank == 0 and root not in _checked:
        try:
            _storage(root).check_writable()
            _checked.add(root)
        except (CheckpointError, ConfigError) as error:
            outcome = (type(error).__name__, str(error))
        except Exception as error:  # noqa: BLE001 - said on every rank below
            outcome = ("CheckpointError", f"cannot use {_redacted(root)} for checkpoints: {type(error).__name__}: "
                                          f"{error}")
    outcome = control.broadcast_object(outcome)
    if outcome is not None:
        raise (ConfigError if outcome[0] == "ConfigError" else CheckpointError)(outcome[1])


def _assignment(reports: list) -> dict:
    """{file: the rank that uploads it}: each file by one of the ranks that wrote it (round robin, so that the
    files of a sharded checkpoint go up from every rank at once)."""
    writers: dict = {}
    for rank, (_, names, _) in enumerate(reports):
        for name in names:
            writers.setdefault(name, []).append(rank)
    return {name: ranks[i % len(ranks)] for i, (name, ranks) in enumerate(sorted(writers.items()))}


def _upload(storage, temp: str, names: list, staging: str) -> dict:
    def one(name):
        return name, storage.upload(os.path.join(temp, name), f"{staging}/{name}")

    with ThreadPoolExecutor(max_workers=max(1, min(workers(), len(names) or 1))) as pool:
        return dict(pool.map(one, names))


def publish(target: RemoteTarget, temp: str, reports: list, gather, *, rank: int, writer: bool, local_main: bool,
            iteration,
            num_processes: int, total_limit, describe) -> None:
    """The remote commit, on every process, after every process wrote its files into `temp`: upload, agree,
    rank 0 writes the manifest and rotates, the staged files are removed. Raises the same error on every process."""
    storage = _storage(target.parent)
    plan = _assignment(reports)
    problem, sizes = None, {}
    try:
        mine = [name for name, uploader in plan.items() if uploader == rank]
        if writer:  # what a save hook wrote into the folder, which no process reported
            mine += sorted(set(folders.sizes_under(temp, "")) - set(plan))
        sizes = _upload(storage, temp, mine, target.staging)
    except Exception as error:  # noqa: BLE001 - reported to every rank below, nothing is committed
        problem = error
    uploads = gather((None if problem is None else describe(problem), sizes))
    failed = [f"rank {r}: {error}" for r, (error, _) in enumerate(uploads) if error]
    problem = None
    if not failed and rank == 0:
        try:
            files = {name: size for _, part in uploads for name, size in part.items()}
            checksums = {name: spec for _, _, specs in reports for name, spec in specs.items() if name in files}
            storage.commit(target.staging, target.name, {
                "format": "hasten-checkpoint", "complete": True, "files": files, "crc32": {}, "checksums": checksums,
                "iteration": iteration, "num_processes": num_processes})
            if total_limit is not None:
                rotate(storage, target.name, total_limit)
        except Exception as error:  # noqa: BLE001
            problem = error
    elif failed and rank == 0:
        storage.abort(target.staging, target.name)
    outcome = gather(None if problem is None else describe(problem))
    if local_main or writer:
        durable.remove_tree(temp)
    if failed:
        raise CheckpointError(f"save_state({target.url}) failed while uploading: {'; '.join(failed)}; nothing was "
                              "committed and the previous checkpoint is intact")
    if outcome[0]:
        raise CheckpointError(f"could not commit checkpoint {target.url}: {outcome[0]}")


def rotate(storage, keep: str, total_limit: int) -> None:
    """Keep the newest `total_limit` committed checkpoints (the one just committed among them); remove the
    uncommitted prefixes a dead save left (they were named in a warning by `committed`)."""
    committed = storage.committed("")
    numbered = sorted((folders.number_in(n), n) for n in committed if folders.number_in(n) is not None)
    for _, name in numbered[:max(0, len(numbered) - int(total_limit))]:
        if name != keep:
            storage.delete(name)
    for entry in storage.listdir(""):
        if (entry not in committed and not entry.startswith(".") and folders.number_in(entry) is not None
                and entry != keep):
            storage.delete(entry)


# -- loading ----------------------------------------------------------------------------------------------------
def committed_under(root: str) -> list:
    """The committed checkpoints under the URL `root`, oldest first (by the number in their names), as URLs."""
    storage = _storage(root)
    names = [n for n in storage.committed("") if folders.number_in(n) is not None]
    return [join(root, n) for n in sorted(names, key=folders.number_in)]


def objects_in(url: str) -> list:
    """The file names a committed checkpoint holds (from its manifest)."""
    parent, name = _split(url)
    manifest = _storage(parent).manifest(name) or {}
    return sorted(manifest.get("files", {}))


def fetch(url: str, local_main: bool, barrier) -> str:
    """Download the committed checkpoint at `url` into a local folder (each machine's first process downloads;
    `barrier` makes the others wait) and return that folder, which holds a complete marker."""
    parent, name = _split(url)
    storage = _storage(parent)
    local = os.path.join(staging_root(), "loaded", _key(url), name)
    problem = None
    if local_main:
        try:
            _download(storage, name, local, url)
        except Exception as error:  # noqa: BLE001 - said on every rank below
            problem = f"{type(error).__name__}: {error}"
    failures = [f"rank {r}: {m}" for r, m in enumerate(control.all_gather_objects(problem)) if m]
    barrier()
    if failures:
        raise CheckpointError(f"load_state({url}) could not download the checkpoint: {'; '.join(failures)}")
    return local


def _download(storage, name: str, local: str, url: str) -> None:
    manifest = storage.manifest(name)
    if manifest is None or not manifest.get("complete"):
        raise CheckpointError(f"{url} is not a committed checkpoint (no manifest): a save into it did not finish; "
                              "load an older checkpoint")
    durable.remove_tree(local)
    temp = folders.prepare_target(local, automatic=False, token=uuid.uuid4().hex[:12])
    names = sorted(manifest.get("files", {}))

    def one(file):
        path = os.path.join(temp, *file.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        storage.download(storage.resolve(name, file), path)

    with ThreadPoolExecutor(max_workers=max(1, min(workers(), len(names) or 1))) as pool:
        list(pool.map(one, names))
    folders.commit(temp, local, manifest.get("files", {}), manifest.get("iteration"),
                   manifest.get("num_processes", 1), rank=0, checksums=manifest.get("checksums"))


def release(local: str, local_main: bool) -> None:
    """Remove a downloaded copy once loaded (on each machine's first process)."""
    if local_main and local.startswith(os.path.join(staging_root(), "loaded")):
        durable.remove_tree(os.path.dirname(local))


# -- save_model -------------------------------------------------------------------------------------------------
def save_directory(url: str, write) -> None:
    """`save_model` to a URL: `write(local_dir)` writes the files locally (returns their names), then they are
    uploaded in parallel, the index last, and shards a previous save left that the new index does not name are
    removed. Runs on the writing process only."""
    storage = _storage(url)
    if url not in _checked:
        storage.check_writable()
        _checked.add(url)
    local = os.path.join(staging_root(), "models", _key(url) + "-" + uuid.uuid4().hex[:8])
    try:
        names = write(local)
        index = [n for n in names if n.endswith(".index.json")]
        shards = [n for n in names if n not in index]
        _upload(storage, local, shards, "")
        _upload(storage, local, index, "")
        for entry in storage.listdir(""):
            stale = entry.split("-", 1)[0] in ("model", "pytorch_model") and entry not in names
            if stale and (entry.endswith(".safetensors") or entry.endswith(".bin") or entry.endswith(".index.json")):
                storage.delete(entry)
    finally:
        durable.remove_tree(local)


__all__ = ["RemoteTarget", "check_project_store", "committed_under", "fetch", "is_remote", "objects_in", "publish", "release",
           "save_directory", "staging_root", "start_save"]
