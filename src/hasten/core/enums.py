"""Enumerations shared by every part of hasten (Accelerate's names and values)."""

from __future__ import annotations

import enum
from typing import Literal


class _ValueStrEnumMeta(enum.EnumMeta):
    # `"fp16" in PrecisionType` must test values, as Accelerate users write it.
    def __contains__(cls, item):
        try:
            cls(item)
        except ValueError:
            return False
        return True


EnumWithContains = _ValueStrEnumMeta  # Accelerate's public name for the metaclass


class BaseEnum(str, enum.Enum, metaclass=_ValueStrEnumMeta):
    """An enum whose `str()` is its value and which tests membership by value."""

    def __str__(self):
        return self.value

    @classmethod
    def list(cls):
        return [member.value for member in cls]


class DistributedType(str, enum.Enum):
    """How the current run is distributed."""

    NO = "NO"
    MULTI_CPU = "MULTI_CPU"
    MULTI_GPU = "MULTI_GPU"
    MULTI_NPU = "MULTI_NPU"
    MULTI_MLU = "MULTI_MLU"
    MULTI_SDAA = "MULTI_SDAA"
    MULTI_MUSA = "MULTI_MUSA"
    MULTI_XPU = "MULTI_XPU"
    DEEPSPEED = "DEEPSPEED"
    FSDP = "FSDP"
    XLA = "XLA"
    MEGATRON_LM = "MEGATRON_LM"
    MULTI_HPU = "MULTI_HPU"
    MULTI_NEURON = "MULTI_NEURON"


class SageMakerDistributedType(str, enum.Enum):
    NO = "NO"
    DATA_PARALLEL = "DATA_PARALLEL"
    MODEL_PARALLEL = "MODEL_PARALLEL"


class FP8BackendType(str, enum.Enum):
    NO = "NO"
    TE = "TE"
    MSAMP = "MSAMP"
    AO = "AO"


class ComputeEnvironment(str, enum.Enum):
    LOCAL_MACHINE = "LOCAL_MACHINE"
    AMAZON_SAGEMAKER = "AMAZON_SAGEMAKER"


class PrecisionType(BaseEnum):
    NO = "no"
    FP8 = "fp8"
    FP16 = "fp16"
    BF16 = "bf16"


class DynamoBackend(BaseEnum):
    NO = "NO"
    EAGER = "EAGER"
    AOT_EAGER = "AOT_EAGER"
    INDUCTOR = "INDUCTOR"
    AOT_TS_NVFUSER = "AOT_TS_NVFUSER"
    NVPRIMS_NVFUSER = "NVPRIMS_NVFUSER"
    CUDAGRAPHS = "CUDAGRAPHS"
    OFI = "OFI"
    FX2TRT = "FX2TRT"
    ONNXRT = "ONNXRT"
    TENSORRT = "TENSORRT"
    AOT_TORCHXLA_TRACE_ONCE = "AOT_TORCHXLA_TRACE_ONCE"
    TORCHXLA_TRACE_ONCE = "TORCHXLA_TRACE_ONCE"
    TVM = "TVM"
    HPU_BACKEND = "HPU_BACKEND"
    NEURON = "NEURON"


class LoggerType(BaseEnum):
    ALL = "all"
    AIM = "aim"
    TENSORBOARD = "tensorboard"
    WANDB = "wandb"
    TRACKIO = "trackio"
    COMETML = "comet_ml"
    MLFLOW = "mlflow"
    CLEARML = "clearml"
    DVCLIVE = "dvclive"
    SWANLAB = "swanlab"


class RNGType(BaseEnum):
    TORCH = "torch"
    CUDA = "cuda"
    MLU = "mlu"
    SDAA = "sdaa"
    MUSA = "musa"
    NPU = "npu"
    XLA = "xla"
    XPU = "xpu"
    HPU = "hpu"
    NEURON = "neuron"
    GENERATOR = "generator"


class DDPCommunicationHookType(BaseEnum):
    NO = "no"
    FP16 = "fp16"
    BF16 = "bf16"
    POWER_SGD = "power_sgd"
    BATCHED_POWER_SGD = "batched_power_sgd"


class CustomDtype(enum.Enum):
    FP8 = "fp8"
    INT4 = "int4"
    INT2 = "int2"


# Multi-process types whose collectives go through torch.distributed.
TORCH_DISTRIBUTED_TYPES = frozenset(
    t for t in DistributedType if t not in (DistributedType.NO, DistributedType.XLA)
)


# Allowed values that Accelerate keeps as plain lists (its `utils.constants`); hasten keeps every allowed value
# here, and the settings table (`hasten.config.settings`) takes its choices from this module only.
TORCH_DYNAMO_MODES = ("default", "reduce-overhead", "max-autotune")
CP_BACKENDS = ("torch",)  # ParallelismConfig.cp_backend
# ParallelismConfig.sp_backend: Accelerate's one value, then hasten's Ulysses on the mesh (hasten.distributed.sequence_parallel)
SP_BACKENDS = ("deepspeed", "hasten")
CP_COMM_STRATEGIES = ("allgather", "alltoall")  # TorchContextParallelConfig.cp_comm_strategy
# TorchPipelineParallelConfig.schedule: torch.distributed.pipelining's schedules, by the names torch gives them.
# The first two run one stage per process; the others two (or more) stages per process.
PP_SCHEDULES = ("1F1B", "GPipe", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")
PP_SINGLE_STAGE_SCHEDULES = ("1F1B", "GPipe")
PP_V_SCHEDULES = ("ZBVZeroBubble", "DualPipeV")  # stages placed in a V: rank r holds r and 2*pp-1-r
# Why context parallelism is refused on CPU processes (measured with torch 2.13.0, gloo): it fails inside SDPA.
CP_ON_CPU = ("context parallelism needs CUDA GPUs: torch's context_parallel has no sharding rule for the CPU attention "
             "kernel (aten._scaled_dot_product_flash_attention_for_cpu has no sharding strategy)")
FSDP_SHARDING_STRATEGY = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2")
FSDP_AUTO_WRAP_POLICY = ("TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP")
FSDP_BACKWARD_PREFETCH = ("BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH")
FSDP_STATE_DICT_TYPE = ("FULL_STATE_DICT", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT")
FSDP_VERSIONS = (1, 2)
RDZV_BACKENDS = ("static", "c10d", "etcd", "etcd-v2")
DEEPSPEED_MULTINODE_LAUNCHERS = ("pdsh", "standard", "openmpi", "mvapich", "mpich", "nossh", "slurm")
DEEPSPEED_ZERO_STAGES = (0, 1, 2, 3)
DEEPSPEED_OFFLOAD_DEVICES = ("none", "cpu", "nvme")
TRACKER_ERROR_POLICIES = ("propagate", "warn", "raise")  # HASTEN_TRACKER_ERRORS: what a failing tracker log does
PRECISION_CHOICES = ("no", "fp16", "bf16", "fp8")  # PrecisionType's values in the order Accelerate's CLI lists them
FP8_BACKENDS = ("ao", "te", "msamp")  # the --fp8_backend spellings (FP8BackendType upper-cases them)
FP8_FORMATS = ("HYBRID", "E4M3", "E5M2")
FP8_AMAX_COMPUTE_ALGORITHMS = ("max", "most_recent")
FP8_OPTIMIZATION_LEVELS = ("O1", "O2")

# Accelerate's type aliases of allowed literal values (for annotations and `typing.get_args`)
Backend = Literal["MSAMP", "TE"]  # fp8 backends of FP8RecipeKwargs' `backend`
OptLevel = Literal["O1", "O2"]  # MS-AMP optimisation levels
FP8Format = Literal["HYBRID", "E4M3", "E5M2"]
AmaxComputeAlgorithm = Literal["max", "most_recent"]
ProfilerActivity = Literal["cpu", "xpu", "mtia", "cuda", "hpu"]
