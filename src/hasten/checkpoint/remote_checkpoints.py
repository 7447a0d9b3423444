"""`save_state` / `load_state` / `save_model` to and from object storage (s3://, gs://, az://, memory://, ...).

A save to a URL runs the local save's steps with the store underneath. Rank 0 opens a version prefix for it first
(`start_save`: the store is checked, the root claimed). Every process then writes its files "into" a hidden local
folder under the staging root (`HASTEN_STAGING_DIR`, else the temporary directory), so that every backend's writer
runs unchanged; but what hasten's own writers write there (safetensors, torch.save, DCP shards) streams straight
into the version prefix as it is produced (`storage/into_store.py`, digested on the way), and only what other code
writes (DeepSpeed's engine, a save hook) lands on the local disk and is uploaded at the commit, each file by one of
the processes that wrote it, in parallel. Everybody reports, and rank 0 writes the manifest last
(`storage/remote.py`: every object with its size and the chunk checksums the writers took). Rotation deletes an old
checkpoint only after the new one is committed. An asynchronous save whose prefix is opened in the background
stages its files and uploads them at the commit. A load downloads the committed objects (in parallel, on each
machine's first process) into a local folder with a complete marker, except DCP shards, which every process reads
from the store; the local reader loads it, verifying each chunk as it comes in; the copy is removed afterwards.

The layout code (`layout.py`) calls in at three points: where a save starts (`start_save`), where it commits
(`publish`) and where a load resolves its input (`fetch`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import tempfile
import uuid
from dataclasses import dataclass

from ..core.errors import CheckpointError, ConfigError
from ..distributed import control
from .storage import dcp as layer_dcp
from .storage import durable, into_store
from .storage import folder as folders
from .storage import marker as markers
from .storage import paths
from .storage import is_remote, storage_for
from .storage.remote import _redacted
from .storage.threads import in_threads

logger = logging.getLogger(__name__)

STAGING_ENV = "HASTEN_STAGING_DIR"
WORKERS_ENV = "HASTEN_STORAGE_WORKERS"
_STALE = re.compile(r"^(?:model|pytorch_model)(?:-\d{5}-of-\d{5})?(?:\.safetensors|\.bin)(?:\.index\.json)?$")
_checked: set = set()  # roots this process has shown to be writable
_continued: set = set()  # roots this process resumed from: its saves there take the root's claim over
_started: set = set()  # roots this process has saved to
DCP_METADATA = ".metadata"


def staging_root() -> str:
    """Where a process stages a remote checkpoint on its own machine (`staging_dir` in docs/settings.md)."""
    from ..config.resolve import runtime_value

    chosen = runtime_value("staging_dir").value
    return os.path.expanduser(chosen or os.path.join(tempfile.gettempdir(), f"hasten-staging-{os.getuid()}"))


def workers() -> int:
    """How many transfers one process runs at once (`storage_workers`: each is one request stream)."""
    from ..config.resolve import runtime_value

    return int(runtime_value("storage_workers").value)


def join(root: str, *names: str) -> str:
    return "/".join([root.rstrip("/"), *[n.strip("/") for n in names if n]])


def _split(url: str):
    parent, _, name = url.rstrip("/").rpartition("/")
    if not name or not parent.partition("://")[2]:  # s3://bucket alone names no checkpoint inside it
        raise ConfigError(f"{url} names no checkpoint inside a bucket: use s3://bucket/path/checkpoint_name")
    return parent, name


def _key(url: str) -> str:
    return hashlib.sha1(url.encode()).hexdigest()[:16]


def _writable(root: str):
    """The storage at `root`, shown writable once per root and process (a probe object written and removed): a
    missing bucket, missing credentials or no permission are one line before anything is written."""
    storage = _storage(root)
    if root not in _checked:
        storage.check_writable()
        _checked.add(root)
    return storage


def _in_parallel(action, items: list) -> list:
    """`action(item)` for every item, at most `workers()` at a time (each is one request stream); the results."""
    return in_threads(action, items, workers())


def _storage(parent: str):
    storage = storage_for(parent)
    storage.take_over = parent in _continued
    storage.parts_in_flight = workers()
    return storage


@dataclass(frozen=True)
class RemoteTarget:
    """One save's destination: the checkpoint `name` under `parent`, staged locally at `local_target`."""

    url: str
    parent: str
    name: str
    local_target: str
    automatic: bool  # named by automatic naming: never written over
    staging: str | None  # the version prefix every rank uploads into (relative to `parent`); None: not opened yet


def start_save(url: str, automatic: bool, broadcast, rank: int, in_background: bool = False) -> RemoteTarget:
    """On every process, where a save starts. The store's side of the start (rank 0: check the store once per root
    -- bucket, credentials, permission --, claim the root for this run, clear what a dead save left, open a version
    prefix) runs now, so that a refusal comes before anything is written; for an asynchronous save other than the
    first one to a root it runs in the background, before the uploads (`publish`), so that the call returns without
    waiting for the store. Every process learns the outcome."""
    parent, name = _split(url)
    local = os.path.join(staging_root(), _key(parent), name)
    target = RemoteTarget(url.rstrip("/"), parent, name, local, automatic, None)
    if in_background and parent in _started:  # every process saves the same sequence: the same answer everywhere
        return target
    staging = _begin(target, broadcast, rank)
    _started.add(parent)
    return RemoteTarget(target.url, parent, name, local, automatic, staging)


def _begin(target: RemoteTarget, share, rank: int) -> str:
    """Rank 0 opens the save's version prefix; `share(value)` hands rank 0's value to every process."""
    token = share(uuid.uuid4().hex[:12])
    outcome = None
    if rank == 0:
        try:
            storage = _writable(target.parent)
            if target.automatic and storage.is_committed(target.name):
                raise ConfigError(f"checkpoint {target.url} already exists; set accelerator.project_configuration."
                                  "iteration past it, or call load_state() first (hasten then continues the numbering)")
            outcome = ("ok", storage.begin(target.name, token))
        except (CheckpointError, ConfigError) as error:
            outcome = (type(error).__name__, str(error))
        except Exception as error:  # noqa: BLE001 - any other failure too, or the other ranks wait in `share`
            outcome = ("CheckpointError", f"save_state({_redacted(target.url)}) could not start on the storage: "
                                          f"{type(error).__name__}: {error}")
    outcome = share(outcome)
    if outcome[0] == "ConfigError":
        raise ConfigError(outcome[1])
    if outcome[0] != "ok":
        raise CheckpointError(outcome[1])
    return outcome[1]


def check_project_store(project, rank: int) -> None:
    """At `prepare()`, when the project directory is a URL: rank 0 writes and removes a probe where the checkpoints
    will go (a missing bucket, missing credentials, no write permission, a bad URL), every rank learns the outcome,
    and the same one line is raised on every rank, before any training is done. Once per root and process."""
    if project.project_dir is None or not is_remote(project.project_dir):
        return
    root = folders.checkpoints_root(project) if project.automatic_checkpoint_naming else str(project.project_dir)
    outcome = None
    if rank == 0:
        try:
            _writable(root)
        except (CheckpointError, ConfigError) as error:
            outcome = (type(error).__name__, str(error))
        except Exception as error:  # noqa: BLE001 - said on every rank below
            outcome = ("CheckpointError", f"cannot use {_redacted(root)} for checkpoints: {type(error).__name__}: "
                                          f"{error}")
    outcome = control.broadcast_object(outcome)
    if outcome is not None:
        raise (ConfigError if outcome[0] == "ConfigError" else CheckpointError)(outcome[1])


def write_into_store(target: RemoteTarget, temp: str) -> None:
    """The files hasten's writers save into `temp` (whole-state files and DCP folders) go straight into the save's
    version prefix, when it is open already (else they are staged in `temp` and uploaded with the rest)."""
    if target.staging is not None:
        into_store.write_into(temp, _storage(target.parent), target.staging, workers())


def abandon(target: RemoteTarget, rank: int) -> None:
    """After a save failed before its uploads: rank 0 removes what went into its version prefix already (DCP folders
    written straight into the store). A failure to remove is a warning: the next save there removes it."""
    if rank != 0 or target.staging is None:
        return
    try:
        _storage(target.parent).abort(target.staging, target.name)
    except Exception as error:  # noqa: BLE001 - the save's own error is what the caller raises
        logger.warning(f"could not remove {_redacted(target.url)}'s unfinished version ({type(error).__name__}: "
                       f"{error}); the next save into it removes it")


def _in_store(reports: list) -> dict:
    """{file: size} of the files a process wrote straight into the store (hasten's own writers, `into_store`)."""
    return {name: spec[into_store.STORED] for _, _, specs in reports for name, spec in specs.items()
            if isinstance(spec, dict) and into_store.STORED in spec}


def _assignment(reports: list) -> dict:
    """{file: the rank that uploads it}: each file by one of the ranks that wrote it (round robin, so that the
    files of a sharded checkpoint go up from every rank at once); files already in the store are not uploaded."""
    stored = _in_store(reports)
    writers: dict = {}
    for rank, (_, names, _) in enumerate(reports):
        for name in names:
            if name not in stored:
                writers.setdefault(name, []).append(rank)
    return {name: ranks[i % len(ranks)] for i, (name, ranks) in enumerate(sorted(writers.items()))}


def _upload(storage, temp: str, names: list, staging: str) -> dict:
    def one(name):
        return name, storage.upload(os.path.join(temp, name), f"{staging}/{name}" if staging else name)

    return dict(_in_parallel(one, names))


def publish(target: RemoteTarget, temp: str, reports: list, gather, *, rank: int, writer: bool, local_main: bool,
            iteration,
            num_processes: int, total_limit, describe) -> None:
    """The remote commit, on every process, after every process wrote its files into `temp`: upload, agree,
    rank 0 writes the manifest and rotates, the staged files are removed. Raises the same error on every process."""
    if target.staging is None:  # an asynchronous save opens its version prefix here, off the training loop
        try:
            staging = _begin(target, lambda value: gather(value)[0], rank)
        except (CheckpointError, ConfigError):
            if local_main or writer:
                durable.remove_tree(temp)
            raise
        target = RemoteTarget(target.url, target.parent, target.name, target.local_target, target.automatic, staging)
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
            files = {**_in_store(reports), **{name: size for _, part in uploads for name, size in part.items()}}
            checksums = {name: {k: v for k, v in spec.items() if k != into_store.STORED}
                         for _, _, specs in reports for name, spec in specs.items() if name in files}
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


def fetch(url: str, local_main: bool) -> str:
    """Download the committed checkpoint at `url` into a local folder (each machine's first process downloads;
    the others wait in the gather of the outcome) and return that folder, which holds a complete marker."""
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
    if failures:
        raise CheckpointError(f"load_state({url}) could not download the checkpoint: {'; '.join(failures)}")
    _continued.add(parent)
    _register_streamed(local, storage)
    return local


def _sharded_folders(names) -> set:
    """The DCP folders among a checkpoint's objects (a folder holding `.metadata`)."""
    return {n.rsplit("/", 1)[0] for n in names if n.endswith("/" + DCP_METADATA)}


def _download(storage, name: str, local: str, url: str) -> None:
    manifest = storage.manifest(name)
    if manifest is None or not manifest.get("complete"):
        raise CheckpointError(f"{url} is not a committed checkpoint (no manifest): a save into it did not finish; "
                              "load an older checkpoint")
    durable.remove_tree(local)
    temp = folders.prepare_target(local, automatic=False, token=uuid.uuid4().hex[:12])
    files = dict(manifest.get("files", {}))
    # Sharded (DCP) folders stay in the store: every process reads its own shards there, each chunk checked against
    # the manifest's digest (`storage/dcp.py`); the local copy keeps their metadata and says where they are.
    sharded = _sharded_folders(files)
    checksums = manifest.get("checksums") or {}
    streamed = {folder: {"name": storage.resolve(name, folder, manifest),
                         "files": {file.split("/", 1)[1]: [size, checksums.get(file)] for file, size in files.items()
                                   if file.split("/", 1)[0] == folder}}
                for folder in sorted(sharded)}
    for file in list(files):
        if file.split("/", 1)[0] in sharded and not file.endswith("/" + DCP_METADATA):
            del files[file]
    names = sorted(files)

    def one(file):
        path = os.path.join(temp, *file.split("/"))
        paths.make_folder(os.path.dirname(path))
        storage.download(storage.resolve(name, file, manifest), path)

    _in_parallel(one, names)
    folders.commit(temp, local, files, manifest.get("iteration"), manifest.get("num_processes", 1), rank=0,
                   checksums={n: c for n, c in (manifest.get("checksums") or {}).items() if n in files},
                   extra={"streamed": streamed})


def _register_streamed(local: str, storage) -> None:
    """Every process learns which sharded folders of the fetched copy at `local` are read from the store."""
    marker = markers.read_marker(local) or {}
    for folder, where in (marker.get("streamed") or {}).items():
        files = {file: (size, spec) for file, (size, spec) in where["files"].items()}
        layer_dcp.stream_from(os.path.join(local, folder), storage, where["name"], files)


def release(local: str, local_main: bool) -> None:
    """Remove a downloaded copy once loaded (on each machine's first process)."""
    layer_dcp.stop_streaming_under(local)
    if local_main and local.startswith(os.path.join(staging_root(), "loaded")):
        durable.remove_tree(os.path.dirname(local))


# -- save_model -------------------------------------------------------------------------------------------------
def save_directory(url: str, write) -> None:
    """`save_model` to a URL: `write(local_dir)` writes the files locally, then they are
    uploaded in parallel, the index last, and shards a previous save left that the new index does not name are
    removed. Runs on the writing process only."""
    storage = _writable(url)
    local = os.path.join(staging_root(), "models", _key(url) + "-" + uuid.uuid4().hex[:8])
    try:
        write(local)
        names = paths.names_in(local)
        index = [n for n in names if n.endswith(".index.json")]
        shards = [n for n in names if n not in index]
        _upload(storage, local, shards, "")
        _upload(storage, local, index, "")
        for entry in storage.listdir(""):  # shards and an index of an earlier save the new files do not replace
            if entry not in names and _STALE.match(entry):
                storage.delete(entry)
    finally:
        durable.remove_tree(local)


__all__ = ["RemoteTarget", "check_project_store", "committed_under", "fetch", "is_remote", "objects_in", "publish", "release",
           "save_directory", "staging_root", "start_save"]
