"""Accelerate's `utils.transformer_engine` path. The module is `hasten.training.fp8.te` itself (not a copy of its names), so
`mock.patch("hasten.utils.transformer_engine.X")` and pickles naming this path reach the code that runs."""

import sys

from ..training.fp8 import te

sys.modules[__name__] = te
