"""Small helpers Accelerate users import from `accelerate.utils`."""

from __future__ import annotations

import logging
import os
import platform
import socket

import torch

from ..checkpointing import clean_state_dict_for_safetensors  # noqa: F401
from ..config.file import write_basic_config  # noqa: F401
from ..distributed.operations import wait_for_everyone  # noqa: F401
from ..distributed.tp_plan import get_model_tp_size, model_has_dtensor  # noqa: F401
from ..launch.machine import (  # noqa: F401
    are_libraries_initialized,
    clear_environment,
    get_free_port,  # noqa: F401
    patch_environment,
)
from ..state import PartialState
from ..training.compilation import (  # noqa: F401
    compile_regions,
    compile_regions_deepspeed,
    compile_regions_fsdp2,
    get_module_children_bottom_up,
    has_compiled_regions,
    has_repeated_blocks,
    is_repeated_blocks,
)


def is_port_in_use(port: int | None = None) -> bool:
    port = port or 29500
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        return sock.connect_ex(("localhost", port)) == 0


def merge_dicts(source: dict, destination: dict) -> dict:
    for key, value in source.items():
        if isinstance(value, dict):
            merge_dicts(value, destination.setdefault(key, {}))
        else:
            destination[key] = value
    return destination


def recursive_getattr(obj, attr: str):
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def convert_bytes(size: float) -> str:
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if size < 1024.0:
            return f"{round(size, 2)} {unit}"
        size /= 1024.0
    return f"{round(size, 2)} PB"


def get_pretty_name(obj) -> str:
    if not hasattr(obj, "__qualname__") and not hasattr(obj, "__name__"):
        obj = getattr(obj, "__class__", obj)
    return getattr(obj, "__qualname__", getattr(obj, "__name__", str(obj)))


def is_compiled_module(module) -> bool:
    from ..backends.unwrap import is_compiled

    return is_compiled(module)


def extract_model_from_parallel(model, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True, recursive: bool = False):
    """Strip DDP/DataParallel/FSDP1/compile containers (see `Accelerator.unwrap_model`)."""
    from ..backends.unwrap import unwrap_model

    return unwrap_model(model, keep_fp32_wrapper=keep_fp32_wrapper, keep_torch_compile=keep_torch_compile, recursive=recursive)


def save(obj, f, save_on_each_node: bool = False, safe_serialization: bool = False) -> None:
    """Write `obj` once per machine (main process, or each node's local main)."""
    state = PartialState()
    writer = state.is_local_main_process if save_on_each_node else state.is_main_process
    if not writer:
        return
    if safe_serialization:
        from safetensors.torch import save_file

        if isinstance(obj, dict):  # safetensors refuses tied weights: keep one name of each, as Accelerate does
            obj = clean_state_dict_for_safetensors(obj)
        write = lambda path: save_file(obj, path, metadata={"format": "pt"})  # noqa: E731
    else:
        write = lambda path: torch.save(obj, path)  # noqa: E731
    if isinstance(f, (str, os.PathLike)):
        from ..checkpoint.storage.durable import atomic_write

        atomic_write(os.fspath(f), write)  # readers see the old file or the new one, never half of one
    else:
        write(f)


def load(f, map_location=None, **kwargs):
    kwargs.setdefault("weights_only", True)
    return torch.load(f, map_location=map_location, **kwargs)


def check_os_kernel() -> None:
    """Log a warning on a Linux kernel older than 5.5.0, where processes are known to hang; a release text
    that is no version (a custom build) is left alone."""
    info = platform.uname()
    if info.system != "Linux":
        return
    from packaging.version import InvalidVersion, Version

    release = info.release.split("-")[0]
    try:
        too_old = Version(release) < Version("5.5.0")
    except InvalidVersion:
        return  # nothing to compare: no claim either way
    if too_old:
        logging.getLogger("hasten.utils.other").warning(
            f"Detected kernel version {release}, which is below the recommended minimum of 5.5.0; this can cause "
            "the process to hang. Upgrade the kernel to 5.5.0 or newer."
        )


def __getattr__(name):
    # NumPy loads on first use of these names only: `import hasten.utils.other` stays free of it.
    if name == "np_core":
        import numpy as np

        return getattr(np, "_core", None) or np.core
    if name == "TORCH_SAFE_GLOBALS":
        # what `torch.load(weights_only=True)` may rebuild in a checkpoint: plain NumPy arrays (RNG states)
        from ..checkpoint.storage.safe_load import numpy_safe_globals

        return numpy_safe_globals()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


from ..logging import get_logger  # noqa: E402

logger = get_logger(__name__)  # Accelerate's module-level logger, at its path
