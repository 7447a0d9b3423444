"""Accelerate's `utils.torch_xla` path; the code lives in `hasten.tpu` (TPU is not built: it refuses)."""

from ..tpu import install_xla  # noqa: F401
