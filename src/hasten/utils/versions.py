"""Accelerate's `utils.versions` path; the code lives in `hasten.core.availability`."""

from ..core.availability import compare_versions, is_torch_version, torch_version  # noqa: F401
