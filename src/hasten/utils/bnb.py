"""Accelerate's `utils.bnb` path; the code lives in `hasten.big_model.bnb` and `hasten.config.quantization`."""

from ..big_model.bnb import (  # noqa: F401
    get_keys_to_not_convert,
    get_parameter_device,
    get_quantized_model_device_map,
    has_4bit_bnb_layers,
    load_and_quantize_model,
    quantize_and_offload_8bit,
    replace_with_bnb_layers,
)
from ..big_modeling import dispatch_model, init_empty_weights  # noqa: F401
from ..config.quantization import BnbQuantizationConfig  # noqa: F401

import logging  # noqa: E402

logger = logging.getLogger(__name__)  # Accelerate's module-level logger, at its path
