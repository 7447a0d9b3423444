"""Accelerate's `utils.constants` path. The module is `hasten.core.constants` itself (not a copy of its names), so
`mock.patch("hasten.utils.constants.X")` and pickles naming this path reach the code that runs."""

import sys

from ..core import constants

sys.modules[__name__] = constants
