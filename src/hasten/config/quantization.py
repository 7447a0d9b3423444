"""`BnbQuantizationConfig`: how `load_and_quantize_model` quantizes a model with bitsandbytes (8-bit LLM.int8 or
4-bit NF4/FP4), with Accelerate's fields, defaults and checks. Dtype names ("fp32", "fp16", "bf16") become torch
dtypes here, once, so the loader only ever sees torch dtypes."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from ..core.dtypes import PRECISION_DTYPES
from ..core.enums import CustomDtype
from ..core.errors import ConfigError

# the float precisions bitsandbytes computes in, by the run's precision names
_DTYPE_NAMES = {name: PRECISION_DTYPES[name] for name in ("fp32", "fp16", "bf16")}
_QUANT_TYPES = ("fp4", "nf4")
_DEFAULT_THRESHOLD = 6.0


def _as_float_dtype(key: str, value) -> torch.dtype:
    if isinstance(value, str):
        if value not in _DTYPE_NAMES:
            raise ConfigError(f"BnbQuantizationConfig: {key}={value!r} is not one of 'fp32', 'fp16', 'bf16' "
                              "(or pass a torch dtype)")
        return _DTYPE_NAMES[value]
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise ConfigError(f"BnbQuantizationConfig: {key}={value!r} must be 'fp32', 'fp16', 'bf16' or a floating-point "
                          "torch dtype")
    return value


def _as_name_list(key: str, value) -> Optional[list]:
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or not all(isinstance(name, str) for name in value):
        raise ConfigError(f"BnbQuantizationConfig: {key} must be a list of module names (strings), got {value!r}")
    return list(value)


@dataclass
class BnbQuantizationConfig:
    """bitsandbytes quantization for `load_and_quantize_model`: exactly one of `load_in_8bit` / `load_in_4bit`.

    `llm_int8_threshold` is the outlier threshold of 8-bit matmuls; `bnb_4bit_quant_type` ("fp4" or "nf4"),
    `bnb_4bit_use_double_quant` (quantize the quantization constants too) and `bnb_4bit_compute_dtype` shape the
    4-bit layers. `torch_dtype` is the dtype of the layers left unquantized (default: fp16 for 8-bit, the compute
    dtype for 4-bit). `skip_modules` are left unquantized in `torch_dtype` (default: the output head and tied
    weights, see `get_keys_to_not_convert`); `keep_in_fp32_modules` are left unquantized in float32.
    """

    load_in_8bit: bool = field(default=False, metadata={"help": "quantize Linear layers to int8 (LLM.int8)"})
    llm_int8_threshold: float = field(default=_DEFAULT_THRESHOLD,
                                      metadata={"help": "outlier threshold of 8-bit matmuls (8-bit only)"})
    load_in_4bit: bool = field(default=False, metadata={"help": "quantize Linear layers to 4 bits"})
    bnb_4bit_quant_type: str = field(default="fp4", metadata={"help": "4-bit data type: 'fp4' or 'nf4'"})
    bnb_4bit_use_double_quant: bool = field(default=False,
                                            metadata={"help": "quantize the 4-bit quantization constants again"})
    bnb_4bit_compute_dtype: Any = field(default="fp16",
                                        metadata={"help": "dtype 4-bit matmuls compute in: 'fp32', 'fp16', 'bf16'"})
    torch_dtype: Any = field(default=None, metadata={"help": "dtype of the layers that are not quantized"})
    skip_modules: Optional[list] = field(default=None, metadata={"help": "modules left unquantized, in torch_dtype"})
    keep_in_fp32_modules: Optional[list] = field(default=None,
                                                 metadata={"help": "modules left unquantized, in float32"})

    def __post_init__(self):
        for key in ("load_in_8bit", "load_in_4bit", "bnb_4bit_use_double_quant"):
            if not isinstance(getattr(self, key), bool):
                raise ConfigError(f"BnbQuantizationConfig: {key} must be True or False, got {getattr(self, key)!r}")
        if self.load_in_8bit == self.load_in_4bit:
            state = "both True" if self.load_in_8bit else "both False"
            raise ConfigError(f"BnbQuantizationConfig: load_in_8bit and load_in_4bit are {state}; set exactly one "
                              "of them to True")
        if isinstance(self.llm_int8_threshold, bool) or not isinstance(self.llm_int8_threshold, (int, float)):
            raise ConfigError(f"BnbQuantizationConfig: llm_int8_threshold must be a number, got "
                              f"{self.llm_int8_threshold!r}")
        if self.bnb_4bit_quant_type not in _QUANT_TYPES:
            raise ConfigError(f"BnbQuantizationConfig: bnb_4bit_quant_type={self.bnb_4bit_quant_type!r} is not one "
                              "of 'fp4', 'nf4'")
        self.bnb_4bit_compute_dtype = _as_float_dtype("bnb_4bit_compute_dtype", self.bnb_4bit_compute_dtype)
        self.skip_modules = _as_name_list("skip_modules", self.skip_modules)
        self.keep_in_fp32_modules = _as_name_list("keep_in_fp32_modules", self.keep_in_fp32_modules)
        if self.load_in_4bit and self.llm_int8_threshold != _DEFAULT_THRESHOLD:
            warnings.warn("BnbQuantizationConfig: llm_int8_threshold applies to 8-bit quantization only; it is "
                          "unused with load_in_4bit", stacklevel=3)
        if self.torch_dtype is None:
            self.torch_dtype = torch.float16 if self.load_in_8bit else self.bnb_4bit_compute_dtype
        self.torch_dtype = _as_float_dtype("torch_dtype", self.torch_dtype)
        # The size of one quantized weight element, for device-map sizing.
        self.target_dtype = torch.int8 if self.load_in_8bit else CustomDtype.INT4
