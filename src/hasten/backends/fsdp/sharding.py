"""The FSDP2 sharding steps moved to `hasten.parallelize.fsdp` (one module per layout step); this path names the same
module object, so earlier imports (and `mock.patch` of its names) reach the real code."""

import sys

from ...parallelize import fsdp

sys.modules[__name__] = fsdp
