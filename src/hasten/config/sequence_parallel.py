"""`DeepSpeedSequenceParallelConfig`: Accelerate's settings for DeepSpeed's Ulysses sequence parallelism. Data on
the config floor, because `ParallelismConfig` makes one by default (sp_size > 1 with the "deepspeed" backend)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional


@dataclass
class DeepSpeedSequenceParallelConfig:
    """Accelerate's settings for DeepSpeed's Ulysses sequence parallelism (`ParallelismConfig(sp_handler=...)`).

    The object is data, checked as Accelerate checks it (the `PARALLELISM_CONFIG_SP_*` variables fill unset fields).
    With `sp_backend="deepspeed"` and `sp_size` above 1, `backends/deepspeed/ulysses.py` registers DeepSpeed's
    Ulysses attention with these values, hands its `mpu` to the engine and wraps prepared loaders.
    """

    sp_seq_length: Optional[int] = None
    sp_seq_length_is_variable: Optional[bool] = None
    sp_attn_implementation: Optional[str] = None

    BUILT_ATTENTION = ("flash_attention_2", "flash_attention_3", "sdpa")
    NO_SEQUENCE_PARALLEL_ATTENTION = ("eager", "flex_attention")

    def __post_init__(self):
        from .resolve import runtime_value  # the PARALLELISM_CONFIG_SP_* variables, by the settings table

        if self.sp_seq_length_is_variable is None:
            found = runtime_value("parallelism_config_sp_seq_length_is_variable").value
            self.sp_seq_length_is_variable = True if found is None else found  # unset: variable, as Accelerate
        if not self.sp_seq_length_is_variable and self.sp_seq_length is None:
            # Accelerate's launcher writes the string "None" for an unset length; the table reads numbers only
            if os.environ.get("PARALLELISM_CONFIG_SP_SEQ_LENGTH") != "None":
                self.sp_seq_length = runtime_value("parallelism_config_sp_seq_length").value
                if self.sp_seq_length is None:
                    raise ValueError("when `sp_seq_length_is_variable` is `False` `sp_seq_length` must be provided "
                                     "either through the constructor or the environment variable "
                                     "PARALLELISM_CONFIG_SP_SEQ_LENGTH")
        if self.sp_attn_implementation is None:
            self.sp_attn_implementation = runtime_value("parallelism_config_sp_attn_implementation").value
        attention = self.sp_attn_implementation
        if attention is None or attention in self.BUILT_ATTENTION:
            return
        if attention in self.NO_SEQUENCE_PARALLEL_ATTENTION:
            raise ValueError(f"Invalid sp_attn_implementation: {attention}. 'eager' and 'flex_attention' are not "
                             "supported with sequence parallelism.")
        if "/" not in attention or "flash-attn" not in attention:  # a Hub-hosted flash attention kernel passes
            raise ValueError(f"Invalid sp_attn_implementation: {attention}. Must be one of "
                             f"{list(self.BUILT_ATTENTION)} or a hub-hosted flash attention kernel (e.g. "
                             "'kernels-community/flash-attn2').")
