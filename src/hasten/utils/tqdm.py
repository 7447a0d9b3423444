"""Accelerate's `utils.tqdm` path; the code lives in `hasten.observe.progress`.

Importing this module makes Python bind `hasten.utils.tqdm` to the module, shadowing the function of the same
name; the module is therefore callable itself, so `hasten.utils.tqdm(iterable)` works either way.
"""

import sys
import types

from ..observe.progress import tqdm


class _CallableModule(types.ModuleType):
    def __call__(self, *args, **kwargs):
        return tqdm(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
