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
    "hasten.config.deepspeed": [
        "DeepSpeedPlugin", "DummyOptim", "DummyScheduler", "HfDeepSpeedConfig", "get_active_deepspeed_plugin",
    ],
    "hasten.backends.deepspeed": ["GatheredParameters", "map_pytorch_optim_to_deepspeed"],
    "hasten.backends.deepspeed_wrappers": [
        "DeepSpeedEngineWrapper", "DeepSpeedOptimizerWrapper", "DeepSpeedSchedulerWrapper",
    ],
    "hasten.backends.fsdp_checkpoint": ["merge_fsdp_weights"],
    "hasten.environment": [
        "str_to_bool", "parse_flag_from_env", "parse_choice_from_env", "get_int_from_env",
    ],
    "hasten.errors": ["DistributedOperationException"],
    "hasten.memory": [
        "find_executable_batch_size", "release_memory", "should_reduce_batch_size", "clear_device_cache",
    ],
    "hasten.launchers": ["notebook_launcher", "debug_launcher"],
    "hasten.modeling": ["load_checkpoint_in_model"],
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
