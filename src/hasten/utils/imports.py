"""Accelerate's `utils.imports` path; the probes live in `hasten.availability`."""

from ..availability import *  # noqa: F401,F403
from ..availability import compare_versions, is_torch_version  # noqa: F401
