"""Reading checkpoint files back safely: `weights_only` torch.load (no pickled code unless asked), safetensors,
and clear errors for corrupt, truncated or unsafe files."""

from __future__ import annotations

import contextlib
import os
import pickle
import re

import torch

from ...core.errors import CheckpointError, UnsafeCheckpointError


# -- safe loading -----------------------------------------------------------------------------------------------
def numpy_safe_globals() -> list:
    """Constructors of plain numeric NumPy arrays (Accelerate's RNG files hold one); they run no user code."""
    import numpy as np

    entries = [np.ndarray, np.dtype]
    core = getattr(np, "_core", None) or np.core
    for module_name in ("numpy.core.multiarray", "numpy._core.multiarray"):
        entries.append((core.multiarray._reconstruct, f"{module_name}._reconstruct"))
    dtypes = getattr(np, "dtypes", None)
    if dtypes is not None:
        entries.extend(getattr(dtypes, n) for n in ("UInt32DType", "Int64DType", "Float64DType", "Float32DType")
                       if hasattr(dtypes, n))
    return entries


def torch_load_safely(path: str, load_kwargs: dict | None = None, map_location="cpu"):
    """torch.load with `weights_only=True` unless the caller opted in with `{"weights_only": False}`."""
    kwargs = dict(load_kwargs or {})
    kwargs.setdefault("weights_only", True)
    kwargs.setdefault("map_location", map_location)
    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint file {path} is missing")
    safe = kwargs["weights_only"]
    context = torch.serialization.safe_globals(numpy_safe_globals()) if safe else contextlib.nullcontext()
    try:
        with context:
            return torch.load(path, **kwargs)
    except pickle.UnpicklingError as error:
        message = str(error)
        # torch names the refused global ("GLOBAL posix.system", "Unsupported global: GLOBAL ..."); other
        # weights-only failures ("Unsupported operand 110") mean the bytes are not a pickle at all.
        refused = re.search(r"GLOBAL ([\w.]+)", message)
        if safe and (refused or "Can only build" in message or "Unsupported class" in message):
            what = f" ({refused.group(1)})" if refused else ""
            raise UnsafeCheckpointError(
                f"refusing to load {path}: it holds pickled Python objects{what} that could run code when loaded. "
                "If you trust this file, opt in with load_state(..., load_kwargs={'weights_only': False})"
            ) from None
        raise CheckpointError(f"checkpoint file {path} is corrupt ({message.splitlines()[-1][:200] if message else error})") from None
    except (RuntimeError, EOFError, OSError, ValueError) as error:
        raise CheckpointError(f"checkpoint file {path} is corrupt or truncated ({error})") from None


def safetensors_load(path: str) -> dict:
    """The safetensors library's own reader: for dtypes the fast reader does not know."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(path, device="cpu")
    except (SafetensorError, OSError, ValueError, RuntimeError) as error:
        raise CheckpointError(f"checkpoint file {path} is corrupt or truncated ({error})") from None
