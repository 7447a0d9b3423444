"""Accelerate's `utils.memory` path; the code lives in `hasten.training.memory`."""

from ..training.memory import clear_device_cache, find_executable_batch_size, release_memory, should_reduce_batch_size  # noqa: F401
