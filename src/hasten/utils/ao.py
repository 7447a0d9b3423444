"""Accelerate's `utils.ao` path. The module is `hasten.training.fp8.ao` itself (not a copy of its names), so
`mock.patch("hasten.utils.ao.X")` and pickles naming this path reach the code that runs."""

import sys

from ..training.fp8 import ao

sys.modules[__name__] = ao
