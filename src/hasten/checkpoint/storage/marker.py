"""The completeness marker: the file that says a checkpoint folder was written whole, and which files it holds."""

from __future__ import annotations

import json
import os

from ...core.errors import CheckpointError

MARKER_NAME = "hasten_checkpoint.json"
MARKER_FORMAT = "hasten-checkpoint"

# -- the completeness marker ------------------------------------------------------------------------------------
def read_marker(folder: str):
    """The marker's content, or None when the folder has none (e.g. a checkpoint Accelerate wrote)."""
    path = os.path.join(folder, MARKER_NAME)
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as handle:
            marker = json.load(handle)
    except (OSError, ValueError) as error:
        raise CheckpointError(f"{path} is unreadable ({error}); the checkpoint in {folder} is damaged") from None
    if not isinstance(marker, dict) or marker.get("format") != MARKER_FORMAT:
        raise CheckpointError(f"{path} is not a hasten checkpoint marker; the checkpoint in {folder} is damaged")
    return marker


def verify_files(folder: str, marker: dict) -> None:
    """Every file the marker lists exists with its recorded size; raises CheckpointError naming the first bad one."""
    if not marker.get("complete", False):
        raise CheckpointError(
            f"the checkpoint in {folder} is incomplete: a save into it was interrupted; load an older checkpoint"
        )
    for name, size in sorted(marker.get("files", {}).items()):
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            raise CheckpointError(f"checkpoint file {path} is missing (listed in {MARKER_NAME})")
        actual = os.path.getsize(path)
        if actual != size:
            raise CheckpointError(
                f"checkpoint file {path} has {actual} bytes but {size} were written: the file is truncated or corrupt"
            )


def is_complete(folder: str) -> bool:
    try:
        marker = read_marker(folder)
        if marker is None:
            return False
        verify_files(folder, marker)
    except CheckpointError:
        return False
    return True
