"""Where Accelerate users look for helpers (`hasten.utils.gather`, ...). An index only: no logic lives here."""

from __future__ import annotations

import importlib

_SOURCES = {
    "hasten.distributed.operations": [
        "TensorInformation", "broadcast", "broadcast_object_list", "concatenate", "convert_outputs_to_fp32",
        "convert_to_fp32", "copy_tensor_to_devices", "find_batch_size", "find_device", "gather", "gather_object",
        "get_data_structure", "get_shape", "honor_type", "ignorant_find_batch_size", "initialize_tensors",
        "is_namedtuple", "is_tensor_information", "is_torch_tensor", "listify", "pad_across_processes",
        "pad_input_tensors", "recursively_apply", "reduce", "send_to_device", "slice_tensors", "wait_for_everyone",
        "CannotPadNestedTensorWarning",
    ],
    "hasten.distributed.rng": ["set_seed", "synchronize_rng_state", "synchronize_rng_states"],
    "hasten.core.enums": [
        "DistributedType", "SageMakerDistributedType", "FP8BackendType", "ComputeEnvironment", "PrecisionType",
        "DynamoBackend", "LoggerType", "RNGType", "DDPCommunicationHookType", "CustomDtype", "BaseEnum",
    ],
    "hasten.config.handlers": [
        "KwargsHandler", "AutocastKwargs", "DistributedDataParallelKwargs", "GradScalerKwargs",
        "InitProcessGroupKwargs", "ProfileKwargs", "GradientAccumulationPlugin", "ProjectConfiguration",
        "DataLoaderConfiguration", "TorchDynamoPlugin",
    ],
    "hasten.config.fsdp": ["FullyShardedDataParallelPlugin"],
    # Megatron-LM's surface, served by hasten's TP/PP/FSDP; the library-only names refuse on use
    "hasten.config.megatron": ["MegatronLMPlugin", "add_model_config_to_megatron_parser"],
    "hasten.utils.megatron_lm": [
        "AbstractTrainStep", "BertTrainStep", "GPTTrainStep", "T5TrainStep", "MegatronEngine",
        "MegatronLMDummyDataLoader", "MegatronLMDummyScheduler", "MegatronLMOptimizerWrapper",
        "MegatronLMSchedulerWrapper", "avg_losses_across_data_parallel_group", "gather_across_data_parallel_groups",
        "megatron_lm_initialize", "megatron_lm_prepare_data_loader", "megatron_lm_prepare_model_optimizer_scheduler",
        "megatron_lm_prepare_optimizer", "megatron_lm_prepare_scheduler",
    ],
    # fp8 training
    "hasten.config.fp8": ["AORecipeKwargs", "TERecipeKwargs", "MSAMPRecipeKwargs", "FP8RecipeKwargs"],
    "hasten.training.fp8.ao": ["convert_model_to_fp8_ao", "filter_first_and_last_linear_layers", "has_ao_layers"],
    "hasten.training.fp8.te": ["apply_fp8_autowrap", "contextual_fp8_autocast", "convert_model", "has_transformer_engine_layers"],
    "hasten.config.quantization": ["BnbQuantizationConfig"],
    "hasten.big_model.bnb": ["has_4bit_bnb_layers", "load_and_quantize_model"],
    "hasten.parallelism_config": [
        "ParallelismConfig", "TorchContextParallelConfig", "TorchTensorParallelConfig", "TorchTensorParallelPlugin",
    ],
    "hasten.distributed.tp_plan": ["get_model_tp_size", "model_has_dtensor"],
    "hasten.config.deepspeed": ["DeepSpeedPlugin", "HfDeepSpeedConfig", "get_active_deepspeed_plugin"],
    "hasten.backends.deepspeed.dummies": ["DummyOptim", "DummyScheduler"],
    "hasten.config.sequence_parallel": ["DeepSpeedSequenceParallelConfig"],
    "hasten.backends.deepspeed.backend": ["GatheredParameters", "map_pytorch_optim_to_deepspeed"],
    "hasten.backends.deepspeed.wrappers": [
        "DeepSpeedEngineWrapper", "DeepSpeedOptimizerWrapper", "DeepSpeedSchedulerWrapper",
    ],
    "hasten.backends.fsdp.checkpoint": ["merge_fsdp_weights"],
    "hasten.core.env": [
        "str_to_bool", "parse_flag_from_env", "parse_choice_from_env", "get_int_from_env",
    ],
    "hasten.core.errors": ["DistributedOperationException"],
    "hasten.training.memory": [
        "find_executable_batch_size", "release_memory", "should_reduce_batch_size", "clear_device_cache",
    ],
    "hasten.launchers": ["notebook_launcher", "debug_launcher"],
    # big-model inference
    "hasten.big_model.loading": [
        "load_checkpoint_in_model", "load_state_dict", "set_module_tensor_to_device", "named_module_tensors",
        "id_tensor_storage", "retie_parameters", "load_offloaded_weights", "get_state_dict_offloaded_model",
        "get_state_dict_from_offload", "has_offloaded_params", "align_module_device", "is_peft_model",
        "get_non_persistent_buffers",
    ],
    "hasten.big_model.device_map": [
        "infer_auto_device_map", "get_balanced_memory", "get_max_memory", "compute_module_sizes",
        "compute_module_total_buffer_size", "get_max_layer_size", "calculate_maximum_sizes", "check_device_map",
        "clean_device_map", "find_tied_parameters", "check_tied_parameters_in_config",
        "check_tied_parameters_on_same_device", "dtype_byte_size", "convert_file_size_to_int",
    ],
    "hasten.big_model.offload": [
        "offload_state_dict", "offload_weight", "load_offloaded_weight", "save_offload_index",
        "OffloadedWeightsLoader", "PrefixedDataset", "extract_submodules_state_dict",
    ],
    "hasten.training.compilation": [
        "compile_regions", "compile_regions_deepspeed", "compile_regions_fsdp2", "has_compiled_regions",
        "get_module_children_bottom_up",
    ],
    "hasten.config.file": ["write_basic_config"],
    "hasten.utils.other": [
        "is_port_in_use", "merge_dicts", "recursive_getattr", "convert_bytes", "get_pretty_name", "is_compiled_module",
        "extract_model_from_parallel", "save", "load", "check_os_kernel",
    ],
    # -- Accelerate's remaining training-stack names --
    "hasten.core.availability": [
        "compare_versions", "deepspeed_required", "is_4bit_bnb_available", "is_8bit_bnb_available", "is_aim_available",
        "is_amdsmi_available", "is_bf16_available", "is_bitsandbytes_multi_backend_available", "is_bnb_available",
        "is_boto3_available", "is_clearml_available", "is_comet_ml_available", "is_cuda_available",
        "is_datasets_available", "is_deepspeed_available", "is_dvclive_available", "is_fp16_available",
        "is_fp8_available", "is_habana_gaudi1", "is_hpu_available", "is_import_timer_available", "is_lomo_available",
        "is_matplotlib_available", "is_megatron_lm_available", "is_mlflow_available", "is_mlu_available",
        "is_mps_available", "is_msamp_available", "is_musa_available", "is_neuron_available", "is_npu_available",
        "is_pandas_available", "is_peft_available", "is_pippy_available", "is_pynvml_available",
        "is_pytest_available", "is_rich_available", "is_rocm_available", "is_sagemaker_available",
        "is_schedulefree_available", "is_sdaa_available", "is_swanlab_available", "is_tensorboard_available",
        "is_timm_available", "is_torch_version", "is_torch_xla_available", "is_torchao_available",
        "is_torchdata_available", "is_torchdata_stateful_dataloader_available", "is_torchvision_available",
        "is_trackio_available", "is_transformer_engine_available", "is_transformer_engine_mxfp8_available",
        "is_transformers_available", "is_triton_available", "is_wandb_available", "is_weights_only_available",
        "is_xccl_available", "is_xpu_available", "torchao_required",
    ],
    "hasten.core.constants": [
        "MITA_PROFILING_AVAILABLE_PYTORCH_VERSION", "MODEL_NAME", "OPTIMIZER_NAME", "PROFILE_PATTERN_NAME",
        "RNG_STATE_NAME", "SAFE_MODEL_NAME", "SAFE_WEIGHTS_INDEX_NAME", "SAFE_WEIGHTS_NAME",
        "SAFE_WEIGHTS_PATTERN_NAME", "SAMPLER_NAME", "SCALER_NAME", "SCHEDULER_NAME",
        "TORCH_DISTRIBUTED_OPERATION_TYPES", "TORCH_LAUNCH_PARAMS", "WEIGHTS_INDEX_NAME", "WEIGHTS_NAME",
        "WEIGHTS_PATTERN_NAME", "XPU_PROFILING_AVAILABLE_PYTORCH_VERSION",
    ],
    "hasten.launch.machine": [
        "are_libraries_initialized", "check_cuda_fp8_capability", "check_cuda_p2p_ib_support", "clear_environment",
        "convert_dict_to_env_variables", "get_cpu_distributed_information", "get_current_device_type",
        "get_free_port", "get_gpu_info", "patch_environment", "purge_accelerate_environment", "set_numa_affinity",
    ],
    "hasten.launch.prepare": [
        "PrepareForLaunch", "prepare_multi_gpu_env", "prepare_simple_launcher_cmd_env", "prepare_deepspeed_cmd_env",
    ],
    "hasten.launch.tpu": ["install_xla", "prepare_sagemager_args_inputs", "prepare_tpu"],
    "hasten.training.precision": ["get_grad_scaler", "get_mixed_precision_context_manager"],
    "hasten.observe.progress": ["tqdm"],
    "hasten.checkpointing": ["clean_state_dict_for_safetensors"],
    "hasten.backends.fsdp.functions": [
        "disable_fsdp_ram_efficient_loading", "enable_fsdp_ram_efficient_loading", "fsdp2_canonicalize_names",
        "fsdp2_switch_optimizer_parameters", "get_fsdp2_grad_scaler", "load_fsdp_model", "load_fsdp_optimizer",
        "save_fsdp_model", "save_fsdp_optimizer", "ensure_weights_retied", "fsdp2_apply_ac", "fsdp2_load_full_state_dict",
        "fsdp2_prepare_model",
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
