"""Accelerate's `utils.random` path. The module is `hasten.distributed.rng` itself (not a copy of its names), so
`mock.patch("hasten.utils.random.X")` and pickles naming this path reach the code that runs."""

import sys

from ..distributed import rng

sys.modules[__name__] = rng
