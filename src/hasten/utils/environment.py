"""Accelerate's `utils.environment` path; the code lives in `hasten.core.env` and `hasten.launch.machine`."""

from ..core.env import (  # noqa: F401
    get_int_from_env,
    parse_choice_from_env,
    parse_flag_from_env,
    str_to_bool,
)
from ..launch.machine import (  # noqa: F401
    CPUInformation,
    are_libraries_initialized,
    check_cuda_fp8_capability,
    check_cuda_p2p_ib_support,
    clear_environment,
    convert_dict_to_env_variables,
    get_cpu_distributed_information,
    get_current_device_type,
    get_driver_version,
    get_gpu_info,
    override_numa_affinity,
    patch_environment,
    purge_accelerate_environment,
    set_numa_affinity,
)

import logging  # noqa: E402

logger = logging.getLogger(__name__)  # Accelerate's module-level logger, at its path
