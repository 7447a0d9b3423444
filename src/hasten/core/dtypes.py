"""The dtype tables: a precision name -> the dtype it computes in, and safetensors' dtype codes <-> torch dtypes.

One home, so a name means the same dtype in the precision policy, FSDP's mixed-precision policy, bitsandbytes'
quantization config, the checkpoint reader/writer and the offload folder.
"""

from __future__ import annotations

import torch

#: A precision name -> the dtype it computes in (None: full precision, nothing to cast). fp8 keeps everything but
#: its matmuls (and FSDP's parameters) in bf16.
PRECISION_DTYPES = {
    "fp16": torch.float16, "bf16": torch.bfloat16, "fp8": torch.bfloat16, "fp32": torch.float32, "no": None,
}


#: safetensors' dtype codes -> torch dtypes (the codes a `.safetensors` header writes). Codes whose dtype this
#: torch lacks are left out, so a file holding one is refused by name rather than misread.
SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool, "C64": torch.complex64,
}
for _code, _name in (("F8_E4M3", "float8_e4m3fn"), ("F8_E5M2", "float8_e5m2"), ("U16", "uint16"),
                     ("U32", "uint32"), ("U64", "uint64")):
    if hasattr(torch, _name):
        SAFETENSORS_DTYPES[_code] = getattr(torch, _name)

#: torch dtypes -> safetensors' codes, for writing.
SAFETENSORS_NAMES = {dtype: code for code, dtype in SAFETENSORS_DTYPES.items()}
