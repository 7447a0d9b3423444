"""Accelerate's `accelerate.utils.offload` path: an index over `hasten.big_model.offload` (no logic here)."""

from ..big_model.offload import (  # noqa: F401
    OffloadedWeightsLoader,
    PrefixedDataset,
    extract_submodules_state_dict,
    load_offloaded_weight,
    offload_state_dict,
    offload_weight,
    save_offload_index,
)
