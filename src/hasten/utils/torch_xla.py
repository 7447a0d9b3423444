"""Accelerate's `utils.torch_xla` path. The module is `hasten.launch.tpu` itself (not a copy of its names), so
`mock.patch("hasten.utils.torch_xla.X")` and pickles naming this path reach the code that runs."""

import sys

from ..launch import tpu

sys.modules[__name__] = tpu
