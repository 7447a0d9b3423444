"""Accelerate's `utils.launch` path: the module object is `hasten.launch.prepare` (so patching
`hasten.utils.launch.which` reaches the code), which also carries `prepare_tpu` from `hasten.launch.tpu`."""

import sys

from ..launch import prepare

sys.modules[__name__] = prepare
