"""Where Accelerate users look for helpers (`hasten.utils.gather`, ...). An index only: no logic lives here."""

from __future__ import annotations

import importlib

_SOURCES = {
    "hasten.operations": [
        "TensorInformation", "broadcast", "broadcast_object_list", "concatenate", "convert_outputs_to_fp32",
        "convert_to_fp32", "copy_tensor_to_devices", "find_batch_size", "find_device", "gather", "gather_object",
        "get_data_structure", "get_shape", "honor_type", "ignorant_find_batch_size", "initialize_tensors",
        "is_namedtuple", "is_tensor_information", "is_torch_tensor", "listify", "pad_across_processes",
        "pad_input_tensors", "recursively_apply", "reduce", "send_to_device", "slice_tensors", "wait_for_everyone",
    ],
    "hasten.rng": ["set_seed", "synchronize_rng_state", "synchronize_rng_states"],
    "hasten.enums": [
        "DistributedType", "SageMakerDistributedType", "FP8BackendType", "ComputeEnvironment", "PrecisionType",
        "DynamoBackend", "LoggerType", "RNGType", "DDPCommunicationHookType", "CustomDtype", "BaseEnum",
    ],
    "hasten.config.dataclasses": [
        "KwargsHandler", "AutocastKwargs", "DistributedDataParallelKwargs", "GradScalerKwargs",
        "InitProcessGroupKwargs", "ProfileKwargs", "GradientAccumulationPlugin", "ProjectConfiguration",
        "DataLoaderConfiguration", "TorchDynamoPlugin",
    ],
    "hasten.config.fsdp": ["FullyShardedDataParallelPlugin"],
    "hasten.backends.fsdp_checkpoint": ["merge_fsdp_weights"],
    "hasten.environment": [
        "str_to_bool", "parse_flag_from_env", "parse_choice_from_env", "get_int_from_env",
    ],
    "hasten.errors": ["DistributedOperationException"],
    "hasten.memory": [
        "find_executable_batch_size", "release_memory", "should_reduce_batch_size", "clear_device_cache",
    ],
    "hasten.launchers": ["notebook_launcher", "debug_launcher"],
    # big-model inference (issue 12)
    "hasten.modeling": [
        "load_checkpoint_in_model", "load_state_dict", "set_module_tensor_to_device", "named_module_tensors",
        "id_tensor_storage", "retie_parameters", "load_offloaded_weights", "get_state_dict_offloaded_model",
        "get_state_dict_from_offload", "has_offloaded_params", "align_module_device", "is_peft_model",
        "get_non_persistent_buffers",
    ],
    "hasten.device_map": [
        "infer_auto_device_map", "get_balanced_memory", "get_max_memory", "compute_module_sizes",
        "compute_module_total_buffer_size", "get_max_layer_size", "calculate_maximum_sizes", "check_device_map",
        "clean_device_map", "find_tied_parameters", "check_tied_parameters_in_config",
        "check_tied_parameters_on_same_device", "dtype_byte_size", "convert_file_size_to_int",
    ],
    "hasten.offload": [
        "offload_state_dict", "offload_weight", "load_offloaded_weight", "save_offload_index",
        "OffloadedWeightsLoader", "PrefixedDataset", "extract_submodules_state_dict",
    ],
    "hasten.compilation": ["compile_regions", "compile_regions_deepspeed", "compile_regions_fsdp2", "has_compiled_regions"],
    "hasten.commands.launch": ["get_free_port"],
    "hasten.config.file": ["write_basic_config"],
    "hasten.utils.other": [
        "is_port_in_use", "patch_environment", "clear_environment", "merge_dicts", "recursive_getattr",
        "convert_bytes", "get_pretty_name", "is_compiled_module", "extract_model_from_parallel", "save", "load",
        "are_libraries_initialized", "check_os_kernel",
    ],
    "hasten.utils.imports": [
        "is_cuda_available", "is_mps_available", "is_xpu_available", "is_npu_available", "is_bf16_available",
        "is_fp16_available", "is_tensorboard_available", "is_wandb_available", "is_mlflow_available",
        "is_aim_available", "is_comet_ml_available", "is_clearml_available", "is_dvclive_available",
        "is_swanlab_available", "is_trackio_available", "is_deepspeed_available", "is_transformers_available",
        "is_datasets_available", "is_rich_available", "is_torch_version", "compare_versions",
    ],
}

_EXPORTS = {name: module for module, names in _SOURCES.items() for name in names}
__all__ = sorted(_EXPORTS)


def register(module: str, names) -> None:
    """Let a room of hasten add names to this index (used by optional parts)."""
    for name in names:
        _EXPORTS[name] = module


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'hasten.utils' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
