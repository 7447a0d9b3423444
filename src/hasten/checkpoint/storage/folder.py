"""The file layer of checkpoint *folders*: where they live, the atomic commit, crash recovery and rotation.

A save goes to a hidden temporary folder next to the target (`temp_for`). Once every file in it is durable,
`commit` writes `hasten_checkpoint.json` (the file list with sizes) and renames the folder into place, so a
process killed at any moment leaves either the new checkpoint, whole, or nothing that `load_state` would take
for one. `recover` repairs a replacement a crash interrupted; `rotate` keeps `total_limit` checkpoints.

Nothing here knows what goes into a checkpoint (that is `layout.py`) nor how a file is written (that
is `durable.py`).
"""

from __future__ import annotations

import logging
import os
import re
import time

from ...core.errors import CheckpointError, ConfigError
from . import durable, into_store
from . import marker as markers
from ..files import rng_name

logger = logging.getLogger(__name__)

# Accelerate writes no marker; a folder with its first RNG file is taken for one of its checkpoints.
ACCELERATE_SIGNATURE = rng_name(0)


# -- where checkpoints live -------------------------------------------------------------------------------------
def checkpoints_root(project) -> str:
    """`<project_dir>/checkpoints`, where automatic naming puts `checkpoint_<i>` folders."""
    if project.project_dir is None:
        raise ConfigError(
            "automatic_checkpoint_naming needs a project directory: pass Accelerator(project_dir=...) or "
            "ProjectConfiguration(project_dir=...)"
        )
    return os.path.join(os.path.expanduser(project.project_dir), "checkpoints")


def number_in(name: str):
    match = re.search(r"\d+", name)
    return int(match.group()) if match else None


def list_checkpoints(root: str) -> list:
    """Checkpoint folders under `root`, oldest first (by the first number in the name, as Accelerate sorts)."""
    if not os.path.isdir(root):
        return []
    entries = []
    for name in os.listdir(root):
        path = os.path.join(root, name)
        if name.startswith(".") or not os.path.isdir(path) or number_in(name) is None:
            continue
        entries.append((number_in(name), name, path))
    return [path for _, _, path in sorted(entries)]


def newest_checkpoint(root: str):
    """The newest folder under `root` that is a complete checkpoint (hasten marker verified, or written by
    Accelerate, which has no marker); damaged or half-written ones are skipped with a warning."""
    for path in reversed(list_checkpoints(root)):
        try:
            marker = markers.read_marker(path)
            if marker is None:
                if os.path.isfile(os.path.join(path, ACCELERATE_SIGNATURE)):
                    return path
                continue
            markers.verify_files(path, marker)
            return path
        except CheckpointError as error:
            logger.warning("skipping checkpoint %s: %s", path, error)
    return None


def sizes_under(folder: str, name: str) -> dict:
    """{path relative to folder: size} for a file, or for every file under a folder ("" = all of `folder`)."""
    path = os.path.join(folder, name) if name else folder
    if os.path.isfile(path):
        return {name: os.path.getsize(path)}
    sizes = {}
    for root, _dirs, files in os.walk(path):
        for file in files:
            full = os.path.join(root, file)
            sizes[os.path.relpath(full, folder)] = os.path.getsize(full)
    return sizes


def bytes_needed(temp: str, target: str) -> int:
    """About how many bytes a save into `target` needs: the larger of what it wrote before it failed and the
    last complete checkpoint there (the same folder, or the newest beside it)."""
    wrote = sum(sizes_under(temp, "").values()) if os.path.isdir(temp) else 0
    previous = target if os.path.isdir(target) else newest_checkpoint(os.path.dirname(target))
    before = 0
    if previous is not None:
        try:
            marker = markers.read_marker(previous)
        except CheckpointError:
            marker = None
        before = sum(marker.get("files", {}).values()) if marker else sum(sizes_under(previous, "").values())
    return max(wrote, before)


def make_durable(folder: str, name: str) -> None:
    """fsync a file, or every file and folder under a folder, that some writer left in `folder`."""
    path = os.path.join(folder, name)
    if into_store.size_written(path) is not None:  # an object a remote save wrote straight into the store
        return
    durable.fsync_tree(path) if os.path.isdir(path) else durable.fsync_file(path)


# -- before a save ----------------------------------------------------------------------------------------------
def recover(target: str) -> None:
    """Finish or undo a replacement of `target` that a crash interrupted (see `commit`)."""
    parent, name = os.path.split(target)
    if not os.path.isdir(parent):
        return
    olds = sorted(n for n in os.listdir(parent) if n.startswith(f".{name}{durable.OLD_TAG}"))
    for old in olds:
        old_path = os.path.join(parent, old)
        if not os.path.exists(target) and markers.is_complete(old_path):
            os.rename(old_path, target)
            durable.fsync_dir(parent)
        else:
            durable.remove_tree(old_path)


def _remove_stale_temps(parent: str) -> None:
    if not os.path.isdir(parent):
        return
    for name in os.listdir(parent):
        if name.startswith(".") and durable.TEMP_TAG in name:
            path = os.path.join(parent, name)
            durable.remove_tree(path) if os.path.isdir(path) else os.remove(path)


def temp_for(target: str, token: str) -> str:
    parent, name = os.path.split(target)
    return os.path.join(parent, f".{name}{durable.TEMP_TAG}{token}")


def prepare_target(target: str, automatic: bool, token: str) -> str:
    """Repair what an earlier crash left, refuse to overwrite an automatically named checkpoint, and make the
    empty temporary folder the save writes into; returns it."""
    parent = os.path.dirname(target)
    os.makedirs(parent, exist_ok=True)
    recover(target)
    if automatic and os.path.exists(target):
        raise ConfigError(
            f"checkpoint {target} already exists; set accelerator.project_configuration.iteration past it, or "
            "call load_state() first (hasten then continues the numbering)"
        )
    _remove_stale_temps(parent)
    temp = temp_for(target, token)
    os.makedirs(temp)
    return temp


# -- the commit -------------------------------------------------------------------------------------------------
def commit(temp: str, target: str, files: dict, iteration, num_processes: int, rank: int,
           checksums: dict | None = None, extra: dict | None = None) -> None:
    """Write the marker into `temp` (whose files are durable already) and put `temp` in `target`'s place.
    `checksums`: {name: spec} of the files whose writers digested them (see `checksum.py`); `extra`: more fields
    for the marker (the storage layer's whole-object crc32s)."""
    marker = {
        "format": markers.MARKER_FORMAT, "version": 1, "complete": True, "iteration": iteration,
        "num_processes": num_processes, "created": time.time(), "files": files,
    }
    if checksums:
        marker["checksums"] = checksums
    marker.update(extra or {})
    durable.write_file(os.path.join(temp, markers.MARKER_NAME), lambda p: durable.save_json(marker, p), rank)
    durable.fsync_dir(temp)
    parent = os.path.dirname(target)
    if not os.path.exists(target):
        os.rename(temp, target)
        durable.fsync_dir(parent)
        durable.crash_point(rank)
        return
    if _holds_only_a_checkpoint(target):
        # Replace a previous hasten checkpoint: move it aside, move the new one in, then delete the old one.
        # A crash between the two renames is repaired by `recover` on the next save or load.
        old = os.path.join(parent, f".{os.path.basename(target)}{durable.OLD_TAG}{os.path.basename(temp)[-12:]}")
        os.rename(target, old)
        durable.crash_point(rank)
        os.rename(temp, target)
        durable.fsync_dir(parent)
        durable.crash_point(rank)
        durable.remove_tree(old)
        return
    # A folder that holds other things too (logs, configs): mark it incomplete, move the files in one by one,
    # then mark it complete. A crash in between leaves it marked incomplete, never half-loaded.
    pending = dict(marker, complete=False)
    durable.atomic_write(os.path.join(target, markers.MARKER_NAME), lambda p: durable.save_json(pending, p))
    for name in sorted(os.listdir(temp)):
        if name == markers.MARKER_NAME:
            continue
        destination = os.path.join(target, name)
        if os.path.isdir(destination):
            durable.remove_tree(destination)
        os.replace(os.path.join(temp, name), destination)
        durable.crash_point(rank)
    durable.fsync_dir(target)
    os.replace(os.path.join(temp, markers.MARKER_NAME), os.path.join(target, markers.MARKER_NAME))
    durable.fsync_dir(target)
    durable.remove_tree(temp)


def _holds_only_a_checkpoint(folder: str) -> bool:
    """True for an empty folder or a hasten checkpoint with nothing else in it: safe to replace whole."""
    entries = set(os.listdir(folder))
    if not entries:
        return True
    try:
        marker = markers.read_marker(folder)
    except CheckpointError:
        return False
    if marker is None:
        return False
    listed = {name.split("/", 1)[0] for name in marker.get("files", {})} | {markers.MARKER_NAME}
    return entries <= listed


def rotate(root: str, keep: str, total_limit: int, rank: int = 0) -> None:
    """Delete the oldest checkpoints so that `total_limit` remain; the one just written always stays."""
    others = [p for p in list_checkpoints(root) if os.path.abspath(p) != os.path.abspath(keep)]
    excess = len(others) + 1 - total_limit
    for path in others[:max(excess, 0)]:
        # Rename first so that a crash mid-delete leaves a hidden folder, not a half-deleted checkpoint.
        doomed = os.path.join(root, f".{os.path.basename(path)}{durable.TEMP_TAG}rotated")
        os.rename(path, doomed)
        durable.crash_point(rank)
        durable.remove_tree(doomed)
    durable.fsync_dir(root)
