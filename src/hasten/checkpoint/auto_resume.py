"""`ProjectConfiguration(automatic_resume=True)`: resume from the newest complete checkpoint without a line of code.

A script prepares its objects in one `prepare()` call or several, and may register more with
`register_for_checkpointing` afterwards. Loading must happen once, when every object the checkpoint holds is
there, and before the first batch is drawn (a loader that has started its pass cannot be moved any more). So the
newest checkpoint is looked up when the `Accelerator` is built, the objects it holds are counted from its file
names, and the load runs at the end of the first `prepare()` / `register_for_checkpointing()` call after which the
accelerator holds at least that many models, optimizers, schedulers and data loaders and exactly that many
registered objects. If training starts (`backward()`) while the load is still waiting, a one-line error says
what is missing instead of training from scratch. See docs/fault_tolerance.md.
"""

from __future__ import annotations

import logging
import os
import re

from . import files
from .storage import folder as folders
from .storage import marker as markers
from .storage import paths
from . import remote_checkpoints as remote
from ..core.errors import CheckpointError, ConfigError
from ..distributed import control

logger = logging.getLogger(__name__)

# File (or folder) names of each kind of object in a save_state checkpoint, with the object's index when > 0:
# the base layout (model.safetensors, pytorch_model_1.bin), FSDP (pytorch_model_fsdp_0, optimizer_0) and
# DeepSpeed (pytorch_model, pytorch_model_1: the optimizer lives inside the engine's folder and is not counted).
_KINDS = {
    "models": re.compile(r"^(?:model|pytorch_model|pytorch_model_fsdp)(?:_(\d+))?(?:\.safetensors|\.bin)?$"),
    "optimizers": re.compile(r"^optimizer(?:_(\d+))?(?:\.bin)?$"),
    "schedulers": re.compile(r"^scheduler(?:_(\d+))?\.bin$"),
    "dataloaders": re.compile(r"^(?:sampler|dl_state_dict)(?:_(\d+))?\.bin$"),
    "custom_objects": files.CUSTOM_PATTERN,
}


def objects_in(folder: str) -> dict:
    """{kind: how many objects of that kind `folder` holds}, read from the file names."""
    counts = dict.fromkeys(_KINDS, 0)
    names = {n.split("/", 1)[0] for n in remote.objects_in(folder)} if remote.is_remote(folder) else paths.names_in(folder)
    for name in names:
        for kind, pattern in _KINDS.items():
            match = pattern.match(name)
            if match:
                counts[kind] = max(counts[kind], int(match.group(1) or 0) + 1)
                break
    return counts


def _whole(path: str) -> bool:
    """A complete hasten checkpoint, or one Accelerate wrote (no marker)."""
    if paths.is_file(os.path.join(path, markers.MARKER_NAME)):
        return markers.is_complete(path)
    return paths.is_file(os.path.join(path, folders.ACCELERATE_SIGNATURE))


class PendingResume:
    """The newest complete checkpoint, waiting until the accelerator holds everything it holds."""

    def __init__(self, path: str):
        self.path = path
        self.expected = objects_in(path)

    @classmethod
    def for_project(cls, project):
        """A pending resume, or None when `project` asks for none or has no checkpoint yet."""
        if not getattr(project, "automatic_resume", False):
            return None
        root = folders.checkpoints_root(project)
        if remote.is_remote(root):  # object storage: only committed checkpoints are listed at all
            found = remote.committed_under(root)
            if not found:
                logger.info("automatic_resume: no committed checkpoint under %s yet; starting from the beginning", root)
                return None
            return cls(found[-1])
        path = folders.newest_checkpoint(root)
        if path is None:
            if folders.list_checkpoints(root):
                raise CheckpointError(f"automatic_resume: no complete checkpoint in {root} (each one is damaged; "
                                      "see the warnings); remove them to start over")
            logger.info("automatic_resume: no checkpoint in %s yet; starting from the beginning", root)
            return None
        return cls(path)

    def _held(self, accelerator) -> dict:
        return {
            "models": len(accelerator._models), "optimizers": len(accelerator._optimizers),
            "schedulers": len(accelerator._schedulers), "dataloaders": len(accelerator._dataloaders),
            "custom_objects": len(accelerator._custom_objects),
        }

    def _ready(self, held: dict) -> bool:
        return held["custom_objects"] == self.expected["custom_objects"] and all(
            held[kind] >= count for kind, count in self.expected.items() if kind != "custom_objects"
        ) and held["models"] > 0

    def try_load(self, accelerator) -> bool:
        """Load when everything is there; True once loaded (the caller then forgets this object)."""
        if not self._ready(self._held(accelerator)):
            return False
        # The newest complete checkpoint first; one whose bytes turn out damaged while they are read (a checksum
        # mismatch, a file that no longer parses) on any process is passed over, on every process alike, for the
        # one before it. Loading an older one restores every object again, over what the damaged one had set.
        root = os.path.dirname(self.path)
        newest = folders.number_in(os.path.basename(self.path))
        if remote.is_remote(self.path):
            candidates = [u for u in reversed(remote.committed_under(root))
                          if folders.number_in(os.path.basename(u)) <= newest]
        else:
            candidates = [p for p in reversed(folders.list_checkpoints(root))
                          if folders.number_in(os.path.basename(p)) <= newest and _whole(p)]
        for path in candidates:
            logger.info("automatic_resume: resuming from %s", path)
            problem = None
            try:
                # A resumed run's script does not skip batches by hand: the loaders continue where they stood.
                accelerator._load_state(path, loader_positions=True)
            except CheckpointError as error:
                problem = error
            failures = [f"rank {rank}: {message}" for rank, message in
                        enumerate(control.all_gather_objects(None if problem is None else str(problem))) if message]
            if not failures:
                return True
            logger.warning("automatic_resume: %s is damaged (%s); falling back to the checkpoint before it",
                           path, "; ".join(failures))
        raise CheckpointError(f"automatic_resume: no checkpoint in {root} loads (each one is damaged; see the "
                              "warnings); remove them to start over")

    def missing(self, accelerator) -> ConfigError:
        """The error for training that starts before everything the checkpoint holds was prepared."""
        held = self._held(accelerator)
        wanted = ", ".join(f"{count} {kind.replace('_', ' ')} (have {held[kind]})"
                           for kind, count in self.expected.items()
                           if held[kind] < count or (kind == "custom_objects" and held[kind] != count))
        return ConfigError(
            f"automatic_resume: training started before everything in {self.path} was prepared: it holds {wanted}. "
            "Prepare (and register_for_checkpointing) the same objects as the run that saved it, before the first "
            "backward(), or set automatic_resume=False and call accelerator.load_state() yourself"
        )
