"""Accelerate's `utils.memory` path. The module is `hasten.training.memory` itself (not a copy of its names), so
`mock.patch("hasten.utils.memory.X")` and pickles naming this path reach the code that runs."""

import sys

from ..training import memory

sys.modules[__name__] = memory
