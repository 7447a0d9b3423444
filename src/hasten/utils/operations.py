"""Accelerate's `utils.operations` path; the code lives in `hasten.distributed.operations`."""

from ..backends.deepspeed.backend import GatheredParameters  # noqa: F401 - Accelerate keeps it here
from ..distributed.operations import *  # noqa: F401,F403
from ..distributed.operations import __all__  # noqa: F401
