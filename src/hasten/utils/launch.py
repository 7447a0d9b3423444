"""Accelerate's `utils.launch` path; the code lives in `hasten.launch.prepare` (and `hasten.launch.tpu`)."""

from ..launch.prepare import (  # noqa: F401
    PrepareForLaunch,
    _convert_nargs_to_dict,
    env_var_path_add,
    prepare_deepspeed_cmd_env,
    prepare_multi_gpu_env,
    prepare_extend_env_parallelism_config,
    prepare_simple_launcher_cmd_env,
    setup_fp8_env,
)
from ..launch.tpu import prepare_tpu  # noqa: F401
