"""Helpers over the process environment and the machine (Accelerate's `utils.environment` extras).

Everything here answers without initialising a device: GPU facts come from `nvidia-smi`, so a process
can still fork after asking.
"""

from __future__ import annotations

import functools
import logging
import os
import platform
import shutil
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass

from ..core.env import get_int_from_env, parse_flag_from_env

# named for the public module these helpers are read from (Accelerate's `utils.environment`): under the alias,
# `logging.getLogger("accelerate.utils.environment")` is this logger
logger = logging.getLogger("hasten.utils.environment")

# characters that would break a `KEY=VALUE` line of an env file or a shell command built from it
_FORBIDDEN_IN_ENV = (";", "\n", "<", ">", " ")
# variables a run sets and a test must not leak into the next one
_RUN_PREFIXES = ("ACCELERATE_", "HASTEN_")


# -- os.environ, for a block ------------------------------------------------------------------------------------
@contextmanager
def patch_environment(**kwargs):
    """Set environment variables (upper-cased keys, str values) for a block, then restore them."""
    saved = {}
    for key, value in kwargs.items():
        key = key.upper()
        saved.setdefault(key, os.environ.get(key))
        os.environ[key] = str(value)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextmanager
def clear_environment():
    """Run a block with an empty `os.environ`; the previous environment comes back afterwards."""
    saved = dict(os.environ)
    os.environ.clear()
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextmanager
def _run_variables_restored():
    before = {k: v for k, v in os.environ.items() if k.startswith(_RUN_PREFIXES)}
    try:
        yield
    finally:
        for key in [k for k in os.environ if k.startswith(_RUN_PREFIXES)]:
            if key not in before:
                del os.environ[key]
        os.environ.update(before)  # also brings back variables the call deleted


def purge_accelerate_environment(func_or_cls):
    """Decorator: `ACCELERATE_*` and `HASTEN_*` variables are as they were after each call.

    On a function, around every call. On a class, around each of its `test*` methods, including those of
    subclasses (wrapped when the subclass is defined), so one test's settings cannot leak into the next.
    """

    def wrap(function):
        if getattr(function, "_hasten_purges_environment", False):
            return function

        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            with _run_variables_restored():
                return function(*args, **kwargs)

        wrapper._hasten_purges_environment = True
        return wrapper

    if not isinstance(func_or_cls, type):
        return wrap(func_or_cls)

    cls = func_or_cls

    def wrap_tests(klass):
        for name, value in list(vars(klass).items()):
            if name.startswith("test") and callable(value):
                setattr(klass, name, wrap(value))

    wrap_tests(cls)
    previous_hook = cls.__dict__.get("__init_subclass__")

    def __init_subclass__(subclass, **kwargs):
        if previous_hook is not None:
            previous_hook.__func__(subclass, **kwargs)
        else:
            super(cls, subclass).__init_subclass__(**kwargs)
        wrap_tests(subclass)  # each subclass between is wrapped when it is defined

    cls.__init_subclass__ = classmethod(__init_subclass__)
    return cls


def convert_dict_to_env_variables(current_env: dict) -> list:
    """`["KEY=VALUE\\n", ...]` for an env file; entries that are empty or hold `; < >`, a space or a newline are
    left out with a warning."""
    lines = []
    for key, value in current_env.items():
        key, value = str(key), str(value)
        if key and value and not any(char in key + value for char in _FORBIDDEN_IN_ENV):
            lines.append(f"{key}={value}\n")
        else:
            logger.warning("skipping environment entry %s=%s: empty, or holds one of ; < > space newline", key, value)
    return lines


# -- this process and machine -----------------------------------------------------------------------------------
@dataclass
class CPUInformation:
    """Where this process sits in a CPU run (from torchrun's, Intel MPI's, Open MPI's or MVAPICH's variables)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1


def get_cpu_distributed_information() -> CPUInformation:
    return CPUInformation(
        rank=get_int_from_env(["RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK"], 0),
        world_size=get_int_from_env(["WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE"], 1),
        local_rank=get_int_from_env(
            ["LOCAL_RANK", "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_RANK"], 0),
        local_world_size=get_int_from_env(
            ["LOCAL_WORLD_SIZE", "MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "MV2_COMM_WORLD_LOCAL_SIZE"], 1),
    )


def get_current_device_type() -> tuple:
    """(device type, distributed type) of this machine's accelerator, without initialising it.

    Vendor devices are asked in Accelerate's order (MLU, SDAA, MUSA, NPU, HPU, XPU, Neuron); otherwise
    the answer is CUDA's, whether or not a GPU is present, as in Accelerate.
    """
    from ..core import availability as a

    for probe, device, kind in (
        (a.is_mlu_available, "mlu", "MULTI_MLU"), (a.is_sdaa_available, "sdaa", "MULTI_SDAA"),
        (a.is_musa_available, "musa", "MULTI_MUSA"), (a.is_npu_available, "npu", "MULTI_NPU"),
        (a.is_hpu_available, "hpu", "MULTI_HPU"), (a.is_xpu_available, "xpu", "MULTI_XPU"),
        (a.is_neuron_available, "neuron", "MULTI_NEURON"),
    ):
        if probe():
            return device, kind
    return "cuda", "MULTI_GPU"


def _nvidia_smi() -> str:
    found = shutil.which("nvidia-smi")
    if found is None and platform.system() == "Windows":
        found = os.path.join(os.environ.get("systemdrive", "C:"), "\\Program Files", "NVIDIA Corporation", "NVSMI",
                             "nvidia-smi.exe")
    return found or "nvidia-smi"


def _query_gpus(field: str) -> list:
    output = subprocess.check_output([_nvidia_smi(), f"--query-gpu={field}", "--format=csv,noheader"],
                                     universal_newlines=True)
    return [line.strip() for line in output.strip().splitlines() if line.strip()]


def get_gpu_info() -> tuple:
    """(GPU names, GPU count) from nvidia-smi. Raises (FileNotFoundError, CalledProcessError) without one."""
    names = _query_gpus("name")
    return names, len(names)


def get_driver_version() -> str:
    """The NVIDIA driver version (of the first GPU), from nvidia-smi."""
    return _query_gpus("driver_version")[0]


def check_cuda_p2p_ib_support() -> bool:
    """False on machines with several RTX 40xx GPUs and a driver older than 550.40.07, whose peer-to-peer and
    InfiniBand transfers hang NCCL; True everywhere else (including machines without nvidia-smi)."""
    from packaging.version import parse

    try:
        names, count = get_gpu_info()
        if count > 1 and any("RTX 40" in name for name in names):
            return parse(get_driver_version()) >= parse("550.40.07")
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        pass
    return True


@functools.lru_cache
def check_cuda_fp8_capability() -> bool:
    """The first GPU can compute in fp8 (compute capability 8.9 or newer). False without a GPU (Accelerate
    raises there)."""
    try:
        capability = tuple(int(part) for part in _query_gpus("compute_capability")[0].split("."))
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        import torch

        if not torch.cuda.is_available():
            return False
        capability = torch.cuda.get_device_capability()
    return capability >= (8, 9)


def override_numa_affinity(local_process_index: int, verbose: bool | None = None) -> None:
    """Pin this process to the CPU cores of its GPU's NUMA node (recomputed on every call). No GPU: nothing.

    The node comes from sysfs through the GPU's PCI address (`hasten.distributed.numa`, the same code as
    `--enable_cpu_affinity`), so no NVML or amdsmi is needed; cores this process may not use are left out.
    """
    import torch

    from ..distributed import numa

    if verbose is None:
        verbose = parse_flag_from_env("ACCELERATE_DEBUG_MODE", False)
    if not torch.cuda.is_available():
        return
    device = torch.device("cuda", local_process_index)
    cores = numa.pin_to_numa_node(device.type, numa.pci_bus_id(device), local_process_index)
    if verbose and cores:
        logger.info("process %d pinned to %d CPU cores: %s", local_process_index, len(cores), cores)


@functools.lru_cache
def set_numa_affinity(local_process_index: int, verbose: bool | None = None) -> None:
    """`override_numa_affinity`, done once per process (later calls are free)."""
    override_numa_affinity(local_process_index, verbose=verbose)


def are_libraries_initialized(*library_names: str) -> list:
    """The names among `library_names` that are already imported in this process."""
    return [name for name in library_names if name in sys.modules]


def get_free_port() -> int:
    """A TCP port free on this machine right now (the operating system's choice)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]
