"""Accelerate's `utils.launch` path; the code lives in `hasten.launch_env` (and `hasten.tpu`)."""

from ..launch_env import (  # noqa: F401
    PrepareForLaunch,
    env_var_path_add,
    prepare_deepspeed_cmd_env,
    prepare_multi_gpu_env,
    prepare_simple_launcher_cmd_env,
)
from ..tpu import prepare_tpu  # noqa: F401
