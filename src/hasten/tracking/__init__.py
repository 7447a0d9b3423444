"""Experiment trackers: `GeneralTracker`, one class per tracker library, and the session the Accelerator
delegates `init_trackers` / `log` / `get_tracker` / `end_training` to.

Names load on first access; no tracker library is imported until a tracker is started.
"""

from __future__ import annotations

import importlib

_SOURCES = {
    ".base": [
        "GeneralTracker", "on_main_process", "register_tracker_class", "get_available_trackers",
        "LOGGER_TYPE_TO_CLASS",
    ],
    ".session": ["filter_trackers", "TrackerSession"],
    "..core.errors": ["TrackerError"],
    ".tensorboard": ["TensorBoardTracker"],
    ".wandb": ["WandBTracker"],
    ".trackio": ["TrackioTracker"],
    ".comet": ["CometMLTracker"],
    ".aim": ["AimTracker"],
    ".mlflow": ["MLflowTracker"],
    ".clearml": ["ClearMLTracker"],
    ".dvclive": ["DVCLiveTracker"],
    ".swanlab": ["SwanLabTracker"],
    ".jsonl": ["JSONLinesTracker"],
}
_EXPORTS = {name: module for module, names in _SOURCES.items() for name in names}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name == "logger":  # Accelerate's module-level logger, made on first use (importing trackers stays cheap)
        from ..logging import get_logger

        globals()["logger"] = get_logger(__name__)
        return globals()["logger"]
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return __all__
