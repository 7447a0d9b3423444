"""Accelerate's `utils.ao` path; the code lives in `hasten.training.fp8.ao`."""

from ..training.fp8.ao import (  # noqa: F401
    convert_model_to_fp8_ao,
    filter_first_and_last_linear_layers,
    filter_linear_layers,
    find_first_last_linear_layers,
    has_ao_layers,
)
