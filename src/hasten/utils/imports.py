"""Accelerate's `utils.imports` path; the probes live in `hasten.core.availability`."""

from ..core.availability import *  # noqa: F401,F403
from ..core.availability import compare_versions, is_torch_version  # noqa: F401
