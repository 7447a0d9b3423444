"""Accelerate's `utils.transformer_engine` path; the code lives in `hasten.training.fp8.te`."""

from ..training.fp8.te import (  # noqa: F401
    apply_fp8_autowrap,
    contextual_fp8_autocast,
    convert_model,
    has_transformer_engine_layers,
)
