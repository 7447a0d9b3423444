"""`is_*_available` probes and version checks (Accelerate's `utils.imports` and `utils.versions`).

A probe asks the import system whether a library is installed (`find_spec` plus its package metadata, so
a stray folder of the same name does not count); it never imports the library, so probing costs
microseconds and cannot fail on a broken install. Device probes ask torch, without initialising a device.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import operator
import os
import sys

import torch

from .env import env_value, parse_flag_from_env, str_to_bool

STR_OPERATION_TO_FUNC = {">": operator.gt, ">=": operator.ge, "==": operator.eq, "!=": operator.ne,
                         "<=": operator.le, "<": operator.lt}


def _torch_release() -> str:
    return torch.__version__.split("+")[0]


torch_version = _torch_release()


def compare_versions(library_or_version, operation: str, requirement_version: str) -> bool:
    """`library_or_version` (an installed library's name, a version string or a Version) `operation` the requirement."""
    from packaging.version import Version, parse

    if operation not in STR_OPERATION_TO_FUNC:
        raise ValueError(f"operation must be one of {list(STR_OPERATION_TO_FUNC)}, got {operation!r}")
    version = library_or_version
    if isinstance(version, str) and not version[:1].isdigit():
        version = importlib.metadata.version(version)
    if not isinstance(version, Version):
        version = parse(str(version))
    return STR_OPERATION_TO_FUNC[operation](version, parse(requirement_version))


def is_torch_version(operation: str, version: str) -> bool:
    return compare_versions(_torch_release(), operation, version)


def _installed(name: str, distribution: str | None = None) -> bool:
    """Importable under `name` and installed as a distribution (a folder named like the library does not count)."""
    try:
        if importlib.util.find_spec(name) is None:
            return False
    except (ImportError, ValueError):
        return False
    try:
        importlib.metadata.distribution(distribution or name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _version_at_least(name: str, minimum: str, distribution: str | None = None) -> bool:
    if not _installed(name, distribution):
        return False
    return compare_versions(importlib.metadata.version(distribution or name), ">=", minimum)


def _env_true(value) -> bool:
    try:
        return bool(str_to_bool(value, to_bool=True))
    except ValueError:
        return False


def _probe(name: str, *distributions: str):
    def probe() -> bool:
        return any(_installed(name, d) for d in (distributions or (None,)))

    probe.__name__ = probe.__qualname__ = f"is_{name}_available"
    probe.__doc__ = f"True when {name} is installed (it is not imported)."
    return probe


# -- libraries --------------------------------------------------------------------------------------------------
is_deepspeed_available = _probe("deepspeed")
is_transformers_available = _probe("transformers")
is_datasets_available = _probe("datasets")
is_peft_available = _probe("peft")
is_timm_available = _probe("timm")
is_torchvision_available = _probe("torchvision")
is_torchdata_available = _probe("torchdata")
is_wandb_available = _probe("wandb")
is_comet_ml_available = _probe("comet_ml", "comet-ml")
is_swanlab_available = _probe("swanlab")
is_clearml_available = _probe("clearml")
is_dvclive_available = _probe("dvclive")
is_boto3_available = _probe("boto3")
is_sagemaker_available = _probe("sagemaker")
is_pandas_available = _probe("pandas")
is_matplotlib_available = _probe("matplotlib")
is_pytest_available = _probe("pytest")
is_amdsmi_available = _probe("amdsmi")
is_pynvml_available = _probe("pynvml", "pynvml", "nvidia-ml-py")
is_import_timer_available = _probe("import_timer")
is_lomo_available = _probe("lomo_optim")
is_schedulefree_available = _probe("schedulefree")
is_msamp_available = _probe("msamp", "ms-amp")
is_tqdm_available = _probe("tqdm")
is_mlflow_available = _probe("mlflow", "mlflow", "mlflow-skinny")


def is_tensorboard_available() -> bool:
    return _installed("tensorboard") or _installed("tensorboardX")


def is_trackio_available() -> bool:
    return sys.version_info >= (3, 10) and _installed("trackio")


def is_aim_available() -> bool:
    # aim 4 changed its API; the tracker is written for 3.x
    return _installed("aim") and compare_versions(importlib.metadata.version("aim"), "<", "4.0.0")


def is_rich_available() -> bool:
    """rich is installed and the user asked for it (HASTEN_ENABLE_RICH or ACCELERATE_ENABLE_RICH)."""
    return _env_true(env_value("ENABLE_RICH", "0")) and _installed("rich")


def is_triton_available() -> bool:
    return _installed("triton") or _installed("triton", "pytorch-triton-xpu") or _installed("triton", "triton-xpu")


def is_torchao_available() -> bool:
    return _version_at_least("torchao", "0.6.1")


def is_transformer_engine_available() -> bool:
    return _installed("transformer_engine", "transformer-engine") or _installed(
        "intel_transformer_engine", "intel-transformer-engine")


def is_transformer_engine_mxfp8_available() -> bool:
    """MXFP8 needs Transformer Engine and a Blackwell-class GPU (compute capability 10.0 or newer)."""
    if not _installed("transformer_engine", "transformer-engine") or not torch.cuda.is_available():
        return False
    return torch.cuda.get_device_capability() >= (10, 0)


def is_fp8_available() -> bool:
    """One of the fp8 engines is installed (Transformer Engine, MS-AMP or torchao)."""
    return is_msamp_available() or is_transformer_engine_available() or is_torchao_available()


def is_bnb_available(min_version: str | None = None) -> bool:
    if min_version is None:
        return _installed("bitsandbytes")
    return _version_at_least("bitsandbytes", min_version)


def is_4bit_bnb_available() -> bool:
    return _version_at_least("bitsandbytes", "0.39.0")


def is_8bit_bnb_available() -> bool:
    return _version_at_least("bitsandbytes", "0.37.2")


def is_bitsandbytes_multi_backend_available() -> bool:
    # Knowing this needs bitsandbytes itself; it is asked only where bitsandbytes is about to be used.
    if not _installed("bitsandbytes"):
        return False
    import bitsandbytes

    return "multi_backend" in getattr(bitsandbytes, "features", set())


def is_megatron_lm_available() -> bool:
    """Megatron-LM is installed and the run asked for it (ACCELERATE_USE_MEGATRON_LM)."""
    if not _env_true(env_value("USE_MEGATRON_LM", "0")):
        return False
    return _version_at_least("megatron", "0.8.0", "megatron-core")


def is_torchdata_stateful_dataloader_available() -> bool:
    if not _version_at_least("torchdata", "0.8.0"):
        return False
    return importlib.util.find_spec("torchdata.stateful_dataloader") is not None


def is_torch_distributed_available() -> bool:
    return torch.distributed.is_available()


def is_weights_only_available() -> bool:
    # torch.load(weights_only=True) with an allow-list of globals (torch.serialization.add_safe_globals)
    return is_torch_version(">=", "2.4.0")


def is_pippy_available() -> bool:
    # pipeline parallelism lives in torch.distributed.pipelining from torch 2.4
    return is_torch_version(">=", "2.4.0")


def is_xccl_available() -> bool:
    if not (is_torch_version(">=", "2.7.0") and torch.distributed.is_available()):
        return False
    return torch.distributed.distributed_c10d.is_xccl_available()


# -- devices ----------------------------------------------------------------------------------------------------
def _torch_device_module(name: str, check_device: bool) -> bool:
    module = getattr(torch, name, None)
    if module is None or not hasattr(module, "is_available"):
        return False
    try:
        if check_device:
            module.device_count()
        return bool(module.is_available())
    except RuntimeError:
        return False


def is_cuda_available() -> bool:
    # The NVML check answers without initialising CUDA, so a later fork still works.
    saved = os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK")
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    try:
        return torch.cuda.is_available()
    finally:
        if saved is None:
            os.environ.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)
        else:
            os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = saved


def is_rocm_available() -> bool:
    return torch.version.hip is not None and torch.cuda.is_available()


def is_mps_available(min_version: str = "1.12") -> bool:
    backend = getattr(torch.backends, "mps", None)
    return (backend is not None and is_torch_version(">=", min_version) and backend.is_available()
            and backend.is_built())


def is_xpu_available(check_device: bool = False) -> bool:
    return is_torch_version(">", "2.6") and _torch_device_module("xpu", check_device)


def _vendor_device(package: str, attribute: str, check_device: bool) -> bool:
    """Devices whose torch support comes from a vendor package (torch_npu, torch_mlu, ...): imported only if installed."""
    if importlib.util.find_spec(package) is None:
        return False
    importlib.import_module(package)
    return _torch_device_module(attribute, check_device)


@functools.lru_cache
def is_npu_available(check_device: bool = False) -> bool:
    return _vendor_device("torch_npu", "npu", check_device)


@functools.lru_cache
def is_mlu_available(check_device: bool = False) -> bool:
    return _vendor_device("torch_mlu", "mlu", check_device)


@functools.lru_cache
def is_musa_available(check_device: bool = False) -> bool:
    return _vendor_device("torch_musa", "musa", check_device)


@functools.lru_cache
def is_sdaa_available(check_device: bool = False) -> bool:
    return _vendor_device("torch_sdaa", "sdaa", check_device)


@functools.lru_cache
def is_neuron_available(check_device: bool = False) -> bool:
    return _vendor_device("torch_neuronx", "neuron", check_device)


def is_hpu_available(init_hccl: bool = False) -> bool:
    if importlib.util.find_spec("habana_frameworks") is None:
        return False
    available = _vendor_device("habana_frameworks.torch", "hpu", False)
    if available and init_hccl:
        importlib.import_module("habana_frameworks.torch.distributed.hccl")
    return available


def is_habana_gaudi1() -> bool:
    if not is_hpu_available():
        return False
    experimental = importlib.import_module("habana_frameworks.torch.utils.experimental")
    return experimental._get_device_type() == experimental.synDeviceType.synDeviceGaudi


# USE_TORCH_XLA=0 hides an installed torch_xla (as in Accelerate), read once at import.
USE_TORCH_XLA = parse_flag_from_env("USE_TORCH_XLA", True)


def is_torch_xla_available(check_is_tpu: bool = False, check_is_gpu: bool = False) -> bool:
    if check_is_tpu and check_is_gpu:
        raise ValueError("is_torch_xla_available: pass check_is_tpu or check_is_gpu, not both")
    if not USE_TORCH_XLA or importlib.util.find_spec("torch_xla") is None:
        return False
    if not (check_is_tpu or check_is_gpu):
        return True
    runtime = importlib.import_module("torch_xla.runtime")
    kind = runtime.device_type()
    return kind in ("GPU", "CUDA") if check_is_gpu else kind == "TPU"


def is_bf16_available(ignore_tpu: bool = False) -> bool:
    if is_torch_xla_available(check_is_tpu=True):
        return not ignore_tpu
    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    if is_xpu_available():
        return torch.xpu.is_bf16_supported()
    if is_mps_available():
        return torch.backends.mps.is_macos_or_newer(14, 0)
    return True


def is_fp16_available() -> bool:
    """As in Accelerate: fp16 is refused only on Gaudi 1. (On CPU the run proceeds without autocast.)"""
    return not is_habana_gaudi1()


# -- decorators -------------------------------------------------------------------------------------------------
def _requires(probe, library: str, extra: str):
    def decorator(function):
        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            if not probe():
                raise ImportError(f"{function.__name__} needs {library}: pip install \"hasten[{extra}]\"")
            return function(*args, **kwargs)

        return wrapper

    return decorator


def deepspeed_required(function):
    """Decorated function raises ImportError (with the install line) when DeepSpeed is not installed."""
    return _requires(is_deepspeed_available, "DeepSpeed", "deepspeed")(function)


def torchao_required(function):
    """Decorated function raises ImportError (with the install line) when torchao (>= 0.6.1) is not installed."""
    return _requires(is_torchao_available, "torchao >= 0.6.1", "torchao")(function)


__all__ = sorted(
    [n for n in globals() if n.startswith("is_")]
    + ["compare_versions", "deepspeed_required", "torch_version", "torchao_required", "STR_OPERATION_TO_FUNC"]
)


def is_numpy_available(min_version: str = "1.25.0") -> bool:
    """NumPy is installed at `min_version` or newer."""
    return _installed("numpy") and compare_versions("numpy", ">=", min_version)
