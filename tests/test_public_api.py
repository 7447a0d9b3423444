"""The names Accelerate users import must exist at the same paths in hasten."""

import importlib

import pytest

TOP_LEVEL = [
    "Accelerator", "PartialState", "DistributedType", "skip_first_batches", "notebook_launcher", "debug_launcher",
    "AutocastKwargs", "DataLoaderConfiguration", "DDPCommunicationHookType", "DistributedDataParallelKwargs",
    "FullyShardedDataParallelPlugin", "GradScalerKwargs", "InitProcessGroupKwargs", "ProfileKwargs",
    "find_executable_batch_size", "load_checkpoint_in_model", "synchronize_rng_states",
]
UTILS = [
    "gather", "gather_object", "reduce", "broadcast", "broadcast_object_list", "pad_across_processes",
    "send_to_device", "concatenate", "find_batch_size", "recursively_apply", "convert_to_fp32", "set_seed",
    "synchronize_rng_state", "ProjectConfiguration", "GradientAccumulationPlugin", "TorchDynamoPlugin",
    "PrecisionType", "LoggerType", "RNGType", "DynamoBackend", "release_memory", "patch_environment",
    "write_basic_config", "merge_fsdp_weights", "is_tensorboard_available", "wait_for_everyone",
    "DistributedOperationException", "extract_model_from_parallel", "save", "load",
]
MODULES = {
    "hasten.accelerator": ["Accelerator"],
    "hasten.state": ["PartialState", "AcceleratorState", "GradientState"],
    "hasten.data_loader": ["prepare_data_loader", "BatchSamplerShard", "IterableDatasetShard", "DataLoaderShard",
                           "DataLoaderDispatcher", "SeedableRandomSampler", "skip_first_batches"],
    "hasten.optimizer": ["AcceleratedOptimizer"],
    "hasten.scheduler": ["AcceleratedScheduler"],
    "hasten.logging": ["get_logger"],
    "hasten.launchers": ["notebook_launcher", "debug_launcher"],
    "hasten.tracking": ["GeneralTracker", "TensorBoardTracker", "WandBTracker", "MLflowTracker"],
    "hasten.utils.operations": ["gather", "reduce"],
    "hasten.utils.dataclasses": ["DistributedType", "KwargsHandler", "GradScalerKwargs"],
    "hasten.utils.random": ["set_seed"],
    "hasten.utils.memory": ["find_executable_batch_size", "release_memory"],
}


@pytest.mark.parametrize("name", TOP_LEVEL)
def test_top_level_names(name):
    import hasten

    assert getattr(hasten, name) is not None


@pytest.mark.parametrize("name", UTILS)
def test_utils_names(name):
    import hasten.utils

    assert getattr(hasten.utils, name) is not None


@pytest.mark.parametrize("module, names", sorted(MODULES.items()))
def test_module_paths(module, names):
    loaded = importlib.import_module(module)
    for name in names:
        assert hasattr(loaded, name), f"{module}.{name}"
