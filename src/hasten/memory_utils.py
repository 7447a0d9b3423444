"""Accelerate's old `memory_utils` path, kept so old imports work; it warns, as Accelerate's does."""

import warnings

from .training.memory import find_executable_batch_size, release_memory  # noqa: F401

warnings.warn("hasten.memory_utils is deprecated: import find_executable_batch_size from hasten "
              "(`from hasten import find_executable_batch_size`) or hasten.utils.memory", FutureWarning, stacklevel=2)
