"""Accelerate's `utils.operations` path; the code lives in `hasten.operations`."""

from ..operations import *  # noqa: F401,F403
from ..operations import __all__  # noqa: F401
from ..backends.deepspeed import GatheredParameters  # noqa: F401 - Accelerate keeps it here
