"""Accelerate's `accelerate.utils.modeling` path: an index over hasten's rooms (no logic here)."""

from ..big_model.device_map import (  # noqa: F401
    calculate_maximum_sizes,
    check_device_map,
    check_tied_parameters_in_config,
    check_tied_parameters_on_same_device,
    clean_device_map,
    compute_module_sizes,
    compute_module_total_buffer_size,
    convert_file_size_to_int,
    dtype_byte_size,
    fallback_allocate,
    find_tied_parameters,
    get_balanced_memory,
    get_max_layer_size,
    get_max_memory,
    get_module_leaves,
    get_module_size_with_ties,
    infer_auto_device_map,
)
from ..big_model.loading import (  # noqa: F401
    align_module_device,
    get_non_persistent_buffers,
    get_state_dict_from_offload,
    get_state_dict_offloaded_model,
    has_offloaded_params,
    id_tensor_storage,
    is_peft_model,
    load_checkpoint_in_model,
    load_offloaded_weights,
    load_state_dict,
    named_module_tensors,
    retie_parameters,
    set_module_tensor_to_device,
)
from ..big_model.offload import offload_weight, save_offload_index  # noqa: F401
from ..core.constants import WEIGHTS_INDEX_NAME  # noqa: F401,E402 - Accelerate's modeling module has it too
from ..training.precision import get_grad_scaler, get_mixed_precision_context_manager  # noqa: F401


def check_device_same(first_device, second_device) -> bool:
    """Whether two torch devices are the same device: `cuda` and `cuda:0` are (an accelerator device without an
    index means index 0), which `torch.device.__eq__` says they are not."""
    import torch

    first, second = torch.device(first_device), torch.device(second_device)
    if first.type != second.type:
        return False
    if first.type == "cpu":
        return True
    return (first.index or 0) == (second.index or 0)

import logging  # noqa: E402

logger = logging.getLogger(__name__)  # Accelerate's module-level logger, at its path
