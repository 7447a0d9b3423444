"""File names and fixed lists that Accelerate publishes in `accelerate.utils.constants`.

The checkpoint names are the ones `save_state` writes (see `hasten.checkpoint.layout`), so a checkpoint made by
either library is found by the other. The values must stay equal to Accelerate 1.15.0's.
"""

from __future__ import annotations

import torch

from .availability import STR_OPERATION_TO_FUNC  # noqa: F401 - published here too

# -- checkpoint files -------------------------------------------------------------------------------------------
MODEL_NAME = "pytorch_model"
SAFE_MODEL_NAME = "model"
OPTIMIZER_NAME = "optimizer"
SCHEDULER_NAME = "scheduler"
SAMPLER_NAME = "sampler"
DL_STATE_NAME = "dl_state_dict"  # a use_stateful_dataloader loader's torchdata state (Accelerate's name)
SCALER_NAME = "scaler.pt"
RNG_STATE_NAME = "random_states"
FSDP_MODEL_NAME = "pytorch_model_fsdp"
PROFILE_PATTERN_NAME = "profile_{suffix}.json"
WEIGHTS_NAME = MODEL_NAME + ".bin"
WEIGHTS_PATTERN_NAME = MODEL_NAME + "{suffix}.bin"
WEIGHTS_INDEX_NAME = WEIGHTS_NAME + ".index.json"
SAFE_WEIGHTS_NAME = SAFE_MODEL_NAME + ".safetensors"
SAFE_WEIGHTS_PATTERN_NAME = SAFE_MODEL_NAME + "{suffix}.safetensors"
SAFE_WEIGHTS_INDEX_NAME = SAFE_WEIGHTS_NAME + ".index.json"

# -- choices offered by the config file and the launcher ---------------------------------------------------------
FSDP_SHARDING_STRATEGY = ["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2"]
FSDP_AUTO_WRAP_POLICY = ["TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP"]
FSDP_BACKWARD_PREFETCH = ["BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH"]
FSDP_STATE_DICT_TYPE = ["FULL_STATE_DICT", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT"]
FSDP2_STATE_DICT_TYPE = ["SHARDED_STATE_DICT", "FULL_STATE_DICT"]
DEEPSPEED_MULTINODE_LAUNCHERS = ["pdsh", "standard", "openmpi", "mvapich", "mpich", "nossh", "slurm"]
TORCH_DYNAMO_MODES = ["default", "reduce-overhead", "max-autotune"]
# torchrun's own flags, which `launch` passes through
TORCH_LAUNCH_PARAMS = [
    "nnodes", "nproc_per_node", "rdzv_backend", "rdzv_endpoint", "rdzv_id", "rdzv_conf", "standalone",
    "max_restarts", "monitor_interval", "start_method", "role", "module", "m", "no_python", "run_path",
    "log_dir", "r", "redirects", "t", "tee", "node_rank", "master_addr", "master_port",
]
# distributed types whose collectives go through torch.distributed
CUDA_DISTRIBUTED_TYPES = ["DEEPSPEED", "MULTI_GPU", "FSDP", "MEGATRON_LM", "TP"]
TORCH_DISTRIBUTED_OPERATION_TYPES = CUDA_DISTRIBUTED_TYPES + [
    "MULTI_NPU", "MULTI_MLU", "MULTI_SDAA", "MULTI_MUSA", "MULTI_XPU", "MULTI_CPU", "MULTI_HPU", "MULTI_NEURON",
]
# layers whose weights layer-wise casting keeps in the storage dtype and up-casts for compute
SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING = (
    torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d,
    torch.nn.ConvTranspose1d, torch.nn.ConvTranspose2d, torch.nn.ConvTranspose3d,
    torch.nn.Linear,
)

# -- SageMaker defaults -------------------------------------------------------------------------------------------
SAGEMAKER_PYTORCH_VERSION = "1.10.2"
SAGEMAKER_PYTHON_VERSION = "py38"
SAGEMAKER_TRANSFORMERS_VERSION = "4.17.0"
SAGEMAKER_PARALLEL_EC2_INSTANCES = ["ml.p3.16xlarge", "ml.p3dn.24xlarge", "ml.p4dn.24xlarge"]

# -- minimum versions of features ---------------------------------------------------------------------------------
FSDP_PYTORCH_VERSION = "2.1.0.a0+32f93b1"  # a 2.1 pre-release, as Accelerate publishes it
FSDP2_PYTORCH_VERSION = "2.6.0"
DTENSOR_PYTORCH_VERSION = "2.5.0"
ELASTIC_LOG_LINE_PREFIX_TEMPLATE_PYTORCH_VERSION = "2.2.0"
XPU_PROFILING_AVAILABLE_PYTORCH_VERSION = "2.4.0"
MITA_PROFILING_AVAILABLE_PYTORCH_VERSION = "2.1.0"
BETA_TP_AVAILABLE_PYTORCH_VERSION = "2.3.0"
BETA_TP_AVAILABLE_TRANSFORMERS_VERSION = "4.52.0"
BETA_CP_AVAILABLE_PYTORCH_VERSION = "2.6.0"
BETA_SP_AVAILABLE_DEEPSPEED_VERSION = "0.18.2"

__all__ = [name for name in dir() if name.isupper()]
