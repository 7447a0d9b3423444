"""Accelerate's `utils.offload` path. The module is `hasten.big_model.offload` itself (not a copy of its names), so
`mock.patch("hasten.utils.offload.X")` and pickles naming this path reach the code that runs."""

import sys

from ..big_model import offload

sys.modules[__name__] = offload
