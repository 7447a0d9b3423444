"""Memory helpers: free what a training step held, and find a batch size that fits."""

from __future__ import annotations

import functools
import gc
import inspect

import torch

_OOM_MARKERS = (
    " out of memory.",
    "MPS backend out of memory",
    "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.",
    "DefaultCPUAllocator: can't allocate memory",
    "FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed",
)


def clear_device_cache(garbage_collection: bool = False) -> None:
    if garbage_collection:
        gc.collect()
    # Accelerate's order; HPU keeps all its memory for the process (nothing to empty)
    for name in ("xpu", "mlu", "sdaa", "musa", "npu", "mps", "cuda", "neuron"):
        module = getattr(torch, name, None)
        available = getattr(module, "is_available", lambda: False) if module is not None else (lambda: False)
        if available():
            module.empty_cache()
            return


def release_memory(*objects):
    """Return as many `None`s as objects given (reassign them), then collect garbage and empty device caches."""
    objects = [None] * len(objects)
    clear_device_cache(garbage_collection=True)
    return objects


def should_reduce_batch_size(exception: Exception) -> bool:
    """True if `exception` is an out-of-memory error that a smaller batch may avoid."""
    if isinstance(exception, RuntimeError) and len(exception.args) == 1 and isinstance(exception.args[0], str):
        return any(marker in exception.args[0] for marker in _OOM_MARKERS)
    if isinstance(exception, torch.OutOfMemoryError):
        return True
    return False


def find_executable_batch_size(function=None, starting_batch_size: int = 128, reduce_batch_size_fn=None):
    """Decorator: call `function(batch_size, ...)`, shrinking the batch size by 10% after each out-of-memory error.

    The size that worked is remembered for the next call of the same decorated function.
    """
    if function is None:
        return functools.partial(
            find_executable_batch_size, starting_batch_size=starting_batch_size, reduce_batch_size_fn=reduce_batch_size_fn
        )
    batch_size = starting_batch_size
    if reduce_batch_size_fn is None:
        def reduce_batch_size_fn():
            return int(batch_size * 0.9)

    def decorator(*args, **kwargs):
        nonlocal batch_size
        clear_device_cache(garbage_collection=True)
        params = list(inspect.signature(function).parameters.keys())
        if len(params) < len(args) + 1:
            arg_str = ", ".join(f"{arg}={value}" for arg, value in zip(params[1:], args[1:]))
            raise TypeError(
                f"Batch size was passed into `{function.__name__}` as the first argument when called. "
                f"Remove this as the decorator already does so: `{function.__name__}({arg_str})`"
            )
        while True:
            if batch_size == 0:
                raise RuntimeError("No executable batch size found, reached zero.")
            try:
                return function(batch_size, *args, **kwargs)
            except Exception as error:  # noqa: BLE001 - filtered just below
                if not should_reduce_batch_size(error):
                    raise
                clear_device_cache(garbage_collection=True)
                batch_size = reduce_batch_size_fn()

    return decorator
