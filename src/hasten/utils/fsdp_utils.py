"""Accelerate's `utils.fsdp_utils` path. The module is `hasten.backends.fsdp.functions` itself (not a copy of its
names), so `mock.patch("hasten.utils.fsdp_utils.X")` (and `accelerate.utils.fsdp_utils.X` under the alias) reaches
the code the FSDP2 path runs."""

import sys

from ..backends.fsdp import functions

sys.modules[__name__] = functions
