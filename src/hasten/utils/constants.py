"""Accelerate's `utils.constants` path; the values live in `hasten.constants`."""

from ..constants import *  # noqa: F401,F403
from ..constants import STR_OPERATION_TO_FUNC  # noqa: F401
