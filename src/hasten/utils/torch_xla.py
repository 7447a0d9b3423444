"""Accelerate's `utils.torch_xla` path; the code lives in `hasten.launch.tpu` (TPU is not built: it refuses)."""

from ..launch.tpu import install_xla  # noqa: F401
