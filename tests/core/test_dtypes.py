"""The one dtype table: every precision name the CLI offers, and every safetensors code the writer ranks."""

import torch

from hasten.checkpoint.storage import fast_io
from hasten.core.dtypes import PRECISION_DTYPES, SAFETENSORS_DTYPES, SAFETENSORS_NAMES
from hasten.core.enums import PRECISION_CHOICES


def test_every_precision_choice_names_its_compute_dtype():
    assert {name: PRECISION_DTYPES[name] for name in PRECISION_CHOICES} == {
        "no": None, "fp16": torch.float16, "bf16": torch.bfloat16, "fp8": torch.bfloat16,
    }


def test_safetensors_codes_round_trip_and_cover_the_writer():
    assert all(SAFETENSORS_DTYPES[SAFETENSORS_NAMES[dtype]] is dtype for dtype in SAFETENSORS_NAMES)
    assert set(fast_io._SAFETENSORS_RANK) == set(SAFETENSORS_DTYPES)  # every code written has a rank, and back
    assert SAFETENSORS_DTYPES["BF16"] is torch.bfloat16 and SAFETENSORS_NAMES[torch.float8_e4m3fn] == "F8_E4M3"
