"""Accelerate's `utils.operations` path; the code lives in `hasten.distributed.operations`."""

from ..backends.deepspeed.backend import GatheredParameters  # noqa: F401 - Accelerate keeps it here
from ..distributed.operations import *  # noqa: F401,F403
from ..distributed.operations import (  # noqa: F401 - at Accelerate's operations path only, not in `utils`
    TENSOR_INT_TO_DTYPE,
    TENSOR_TYPE_TO_INT,
    ConvertOutputsToFp32,
    __all__,  # noqa: F401
    chained_operation,
    gather_tensor_shape,
    is_torch_xpu_tensor,
    verify_operation,
)
