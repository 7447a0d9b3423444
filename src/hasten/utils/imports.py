"""`is_*_available` probes. None of them imports the library it asks about."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import operator
import os

import torch

_OPS = {">": operator.gt, ">=": operator.ge, "==": operator.eq, "!=": operator.ne, "<=": operator.le, "<": operator.lt}


def _installed(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def compare_versions(library_or_version, operation: str, requirement_version: str) -> bool:
    from packaging.version import Version

    if operation not in _OPS:
        raise ValueError(f"operation must be one of {list(_OPS)}, got {operation!r}")
    version = library_or_version
    if isinstance(version, str) and not version[:1].isdigit():
        version = importlib.metadata.version(version)
    return _OPS[operation](Version(str(version)), Version(requirement_version))


def is_torch_version(operation: str, version: str) -> bool:
    return compare_versions(torch.__version__.split("+")[0], operation, version)


def is_cuda_available() -> bool:
    return torch.cuda.is_available()


def is_mps_available(min_version: str = "1.12") -> bool:
    return hasattr(torch.backends, "mps") and torch.backends.mps.is_available()


def is_xpu_available(check_device: bool = False) -> bool:
    return hasattr(torch, "xpu") and torch.xpu.is_available()


def is_npu_available(check_device: bool = False) -> bool:
    return hasattr(torch, "npu") and torch.npu.is_available()


def is_bf16_available(ignore_tpu: bool = False) -> bool:
    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    return True


def is_fp16_available() -> bool:
    return torch.cuda.is_available() or is_xpu_available() or is_npu_available() or is_mps_available()


def is_rich_available() -> bool:
    from ..environment import parse_bool

    flag = os.environ.get("HASTEN_ENABLE_RICH", os.environ.get("ACCELERATE_ENABLE_RICH", "0"))
    try:
        wanted = parse_bool(flag)
    except ValueError:  # asking whether rich is available is no place to fail; an unclear value means no
        wanted = False
    return _installed("rich") and wanted


def _probe(name: str):
    def probe() -> bool:
        return _installed(name)

    probe.__name__ = f"is_{name}_available"
    return probe


is_tensorboard_available = _probe("tensorboard")
is_wandb_available = _probe("wandb")
is_mlflow_available = _probe("mlflow")
is_aim_available = _probe("aim")
is_comet_ml_available = _probe("comet_ml")
is_clearml_available = _probe("clearml")
is_dvclive_available = _probe("dvclive")
is_swanlab_available = _probe("swanlab")
is_trackio_available = _probe("trackio")
is_deepspeed_available = _probe("deepspeed")
is_transformers_available = _probe("transformers")
is_datasets_available = _probe("datasets")
