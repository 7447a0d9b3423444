"""Accelerate's `utils.dataclasses` path; the classes live in `hasten.config.handlers` and `hasten.core.enums`."""

from ..config.handlers import *  # noqa: F401,F403
from ..config.handlers import KwargsHandler  # noqa: F401
from ..config.deepspeed import DeepSpeedPlugin  # noqa: F401
from ..config.sequence_parallel import DeepSpeedSequenceParallelConfig  # noqa: F401
from ..config.fp8 import (  # noqa: F401
    AORecipeKwargs,
    FP8RecipeKwargs,
    MSAMPRecipeKwargs,
    TERecipeKwargs,
)
from ..config.fsdp import FullyShardedDataParallelPlugin, get_module_class_from_name  # noqa: F401,E402
from ..config.megatron import (  # noqa: F401,E402
    MODEL_CONFIGS_TO_MEGATRON_PARSERS,
    MegatronLMPlugin,
    add_model_config_to_megatron_parser,
    parse_bert_config,
    parse_glm4_moe_config,
    parse_gpt2_config,
    parse_llama_config,
    parse_t5_config,
)
from ..config.quantization import BnbQuantizationConfig  # noqa: F401,E402
from ..core.enums import *  # noqa: F401,F403
from ..core.enums import (  # noqa: F401
    AmaxComputeAlgorithm,
    Backend,
    EnumWithContains,
    FP8Format,
    OptLevel,
    ProfilerActivity,
)
from ..distributed.operations import TensorInformation  # noqa: F401
from ..parallelism_config import (  # noqa: F401,E402
    TorchContextParallelConfig,
    TorchTensorParallelConfig,
    TorchTensorParallelPlugin,
)

import logging  # noqa: E402

logger = logging.getLogger(__name__)  # Accelerate's module-level logger, at its path
