"""Accelerate's `utils.constants` path; the values live in `hasten.core.constants`."""

from ..core.constants import *  # noqa: F401,F403
from ..core.constants import STR_OPERATION_TO_FUNC  # noqa: F401
