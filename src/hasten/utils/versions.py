"""Accelerate's `utils.versions` path. The module is `hasten.core.availability` itself (not a copy of its names), so
`mock.patch("hasten.utils.versions.X")` and pickles naming this path reach the code that runs."""

import sys

from ..core import availability

sys.modules[__name__] = availability
