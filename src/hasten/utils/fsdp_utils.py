"""Accelerate's `utils.fsdp_utils` path; the code lives in `hasten.backends.fsdp.functions` and `hasten.backends`."""

from ..backends.fsdp.functions import (  # noqa: F401
    disable_fsdp_ram_efficient_loading,
    enable_fsdp_ram_efficient_loading,
    ensure_weights_retied,
    fsdp2_apply_ac,
    fsdp2_canonicalize_names,
    fsdp2_load_full_state_dict,
    fsdp2_prepare_auto_wrap_policy,
    fsdp2_prepare_model,
    fsdp2_switch_optimizer_parameters,
    get_fsdp2_grad_scaler,
    get_module_class_from_name,
    get_parameters_from_modules,
    load_fsdp_model,
    load_fsdp_optimizer,
    merge_fsdp_weights,
    save_fsdp_model,
    save_fsdp_optimizer,
)

from ..logging import get_logger  # noqa: E402

logger = get_logger(__name__)  # Accelerate's module-level logger, at its path
