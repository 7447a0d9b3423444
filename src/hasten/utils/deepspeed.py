"""Accelerate's `utils.deepspeed` path: an index over `hasten.config.deepspeed` (plugin, config), `.dummies` (placeholders)
and `hasten.backends.deepspeed.wrappers` (what `prepare` returns). Importing it does not import deepspeed."""

from ..backends.deepspeed.backend import map_pytorch_optim_to_deepspeed  # noqa: F401
from ..backends.deepspeed.wrappers import (  # noqa: F401
    DeepSpeedEngineWrapper,
    DeepSpeedOptimizerWrapper,
    DeepSpeedSchedulerWrapper,
)
from ..backends.deepspeed.dummies import DummyOptim, DummyScheduler  # noqa: F401
from ..config.deepspeed import (  # noqa: F401
    DeepSpeedPlugin,
    HfDeepSpeedConfig,
    get_active_deepspeed_plugin,
)
