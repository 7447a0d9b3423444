"""Who am I, how many of us are there, and on which device? Pure functions over an environment mapping.

Everything here takes the environment as an argument (default `os.environ`) so that cluster detection is
unit-tested with plain dicts. hasten reads its own `HASTEN_*` variables and Accelerate's `ACCELERATE_*`
ones; when both are set, hasten's win.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Mapping

from ..core.env import env_flag, env_value, first_slurm_host, parse_bool, parse_int, slurm_tasks_on_first_node
from ..core.errors import ConfigError


@dataclass(frozen=True)
class ClusterInfo:
    """Where this process sits in the job, as its launcher described it."""

    launcher: str  # "torchrun", "slurm", "mpi", "env" (plain RANK/WORLD_SIZE) or "single"
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None

    @property
    def num_nodes(self) -> int:
        return max(1, self.world_size // max(1, self.local_world_size))


def _int_var(env: Mapping[str, str], names, default=None, *, minimum=0):
    for name in names:
        if name in env and env[name] != "":
            try:
                value = parse_int(env[name])
            except ValueError:
                raise ConfigError(f"environment variable {name}={env[name]!r} must be an integer") from None
            if value < minimum:
                raise ConfigError(f"environment variable {name}={value} must be >= {minimum}")
            return value
    return default


def detect_cluster(env: Mapping[str, str] | None = None) -> ClusterInfo:
    """Read rank, world size and rendezvous address from torchrun, SLURM (srun), MPI, or nothing at all."""
    env = os.environ if env is None else env
    master_addr = env.get("MASTER_ADDR") or None
    master_port = _int_var(env, ["MASTER_PORT"])
    if master_port is not None and master_port > 65535:
        raise ConfigError(f"environment variable MASTER_PORT={master_port} is not a TCP port (0-65535)")

    if "LOCAL_RANK" in env and "WORLD_SIZE" in env and "RANK" in env:
        # torchrun / torchelastic (or anything that sets the same variables).
        world = _int_var(env, ["WORLD_SIZE"], 1, minimum=1)
        local_world = _int_var(env, ["LOCAL_WORLD_SIZE"], world, minimum=1)
        info = ClusterInfo(
            launcher="torchrun",
            rank=_int_var(env, ["RANK"], 0),
            world_size=world,
            local_rank=_int_var(env, ["LOCAL_RANK"], 0),
            local_world_size=local_world,
            node_rank=_int_var(env, ["GROUP_RANK", "NODE_RANK"], 0),
            master_addr=master_addr,
            master_port=master_port,
        )
    elif "SLURM_PROCID" in env and "SLURM_STEP_ID" in env:
        # Under `srun`: one process per task. (Inside `sbatch` without srun there is only the batch shell.)
        world = _int_var(env, ["SLURM_NTASKS", "SLURM_STEP_NUM_TASKS"], 1, minimum=1)
        local_world = _int_var(env, ["SLURM_NTASKS_PER_NODE"], None, minimum=1)
        if local_world is None:
            local_world = slurm_tasks_on_first_node(env.get("SLURM_STEP_TASKS_PER_NODE", env.get("SLURM_TASKS_PER_NODE", "")))
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or ""
        info = ClusterInfo(
            launcher="slurm",
            rank=_int_var(env, ["SLURM_PROCID"], 0),
            world_size=world,
            local_rank=_int_var(env, ["SLURM_LOCALID"], 0),
            local_world_size=local_world,
            node_rank=_int_var(env, ["SLURM_NODEID"], 0),
            master_addr=master_addr or (first_slurm_host(nodelist) if nodelist else "127.0.0.1"),
            master_port=master_port or 29500,
        )
    elif any(k in env for k in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE")):
        world = _int_var(env, ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE"], 1, minimum=1)
        local_world = _int_var(
            env, ["OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "MV2_COMM_WORLD_LOCAL_SIZE"], world, minimum=1
        )
        rank = _int_var(env, ["OMPI_COMM_WORLD_RANK", "PMI_RANK", "MV2_COMM_WORLD_RANK"], 0)
        info = ClusterInfo(
            launcher="mpi",
            rank=rank,
            world_size=world,
            local_rank=_int_var(env, ["OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "MV2_COMM_WORLD_LOCAL_RANK"], 0),
            local_world_size=local_world,
            # MPI gives no node index (OMPI_COMM_WORLD_NODE_RANK is a per-node rank, not a node number);
            # mpirun places ranks by node by default, so the node is rank // ranks-per-node.
            node_rank=rank // local_world,
            master_addr=master_addr or ("127.0.0.1" if local_world == world else None),
            master_port=master_port or 29500,
        )
    elif _int_var(env, ["WORLD_SIZE"], 1, minimum=1) > 1:
        # Plain RANK/WORLD_SIZE (a hand-written launcher): without LOCAL_WORLD_SIZE, assume one machine.
        world = _int_var(env, ["WORLD_SIZE"], 1, minimum=1)
        local_world = _int_var(env, ["LOCAL_WORLD_SIZE"], world, minimum=1)
        info = ClusterInfo(
            launcher="env",
            rank=_int_var(env, ["RANK"], 0),
            world_size=world,
            local_rank=_int_var(env, ["LOCAL_RANK", "RANK"], 0),
            local_world_size=local_world,
            node_rank=_int_var(env, ["NODE_RANK", "GROUP_RANK"], 0),
            master_addr=master_addr or ("127.0.0.1" if local_world == world else None),
            master_port=master_port or 29500,
        )
    else:
        return ClusterInfo(launcher="single", master_addr=master_addr, master_port=master_port)

    if info.rank >= info.world_size:
        raise ConfigError(f"rank {info.rank} is not below the world size {info.world_size} ({info.launcher} variables)")
    if info.local_rank >= info.local_world_size:
        raise ConfigError(
            f"local rank {info.local_rank} is not below the local world size {info.local_world_size} "
            f"({info.launcher} variables)"
        )
    if info.local_world_size > info.world_size:
        raise ConfigError(
            f"local world size {info.local_world_size} is larger than the world size {info.world_size} "
            f"({info.launcher} variables)"
        )
    if info.world_size > 1 and info.master_addr is None:
        raise ConfigError(
            f"{info.world_size} processes over several machines need a rendezvous address: set MASTER_ADDR "
            "(or launch with `hasten launch --main_process_ip`)"
        )
    return info


# Devices whose torch module comes from a vendor package (imported only when installed, as Accelerate does).
_VENDOR_PACKAGE = {"npu": "torch_npu", "mlu": "torch_mlu", "musa": "torch_musa", "sdaa": "torch_sdaa",
                   "neuron": "torch_neuronx", "hpu": "habana_frameworks.torch"}


def _torch_has(device_type: str) -> bool:
    """Accelerate's availability check for one device kind (the same checks as core.availability's
    `is_<device>_available`, which imports this module: so not called from here)."""
    import importlib
    import importlib.util

    import torch

    if device_type == "cuda":
        return torch.cuda.is_available()
    if device_type == "mps":
        backend = getattr(torch.backends, "mps", None)
        return bool(backend is not None and backend.is_available() and backend.is_built())
    package = _VENDOR_PACKAGE.get(device_type)
    if package is not None:
        if importlib.util.find_spec(package.split(".")[0]) is None or importlib.util.find_spec(package) is None:
            return False
        importlib.import_module(package)
    module = getattr(torch, device_type, None)
    return bool(module is not None and hasattr(module, "is_available") and module.is_available())


# Accelerate's order: MPS first (a Mac has nothing else), the vendor devices before CUDA (NPU's transfer_to_npu
# makes CUDA calls answer for NPUs), XPU and Neuron after it.
DEVICE_ORDER = ("mps", "mlu", "sdaa", "musa", "npu", "hpu", "cuda", "xpu", "neuron")


def detect_device_type(
    cpu: bool = False,
    env: Mapping[str, str] | None = None,
    available: Callable[[str], bool] = _torch_has,
) -> str:
    """The accelerator kind to use: the first present in `DEVICE_ORDER`, else CPU (only when none is present)."""
    env = os.environ if env is None else env
    if cpu or env_flag("USE_CPU", env=env):
        return "cpu"
    forced = env_value("TORCH_DEVICE", env=env)
    if forced:
        return forced.split(":")[0]
    for device_type in DEVICE_ORDER:
        if available(device_type):
            return device_type
    return "cpu"


# The process-group backend of each device kind, as Accelerate names it.
_BACKEND_FOR_DEVICE = {"cuda": "nccl", "xpu": "xccl", "npu": "hccl", "hpu": "hccl", "mlu": "cncl", "musa": "mccl",
                       "sdaa": "tccl", "neuron": "neuron", "cpu": "gloo", "mps": "gloo"}


def choose_backend(device_type: str, requested: str | None = None, env: Mapping[str, str] | None = None,
                   fsdp_cpu_tensors: bool | None = None) -> str:
    """The collective backend for a device kind: NCCL for CUDA, gloo for CPU, or what the user asked for.

    FSDP with CPU offload or a full state dict (`USE_FSDP` on, and `FSDP_OFFLOAD_PARAMS` on or
    `FSDP_STATE_DICT_TYPE=FULL_STATE_DICT`, as `hasten launch` exports them) meets CPU tensors in torch's own
    collectives (the offloaded gradients' norm, fp16's overflow flag, a full state dict gathered to CPU memory):
    the default group must serve both devices, `"cuda:nccl,cpu:gloo"` (`"xpu:xccl,cpu:gloo"`), as Accelerate 1.15
    creates it. NCCL alone fails there on two GPUs or more. `fsdp_cpu_tensors`: the run's FSDP plugin's own answer
    (`FullyShardedDataParallelPlugin.meets_cpu_tensors`), which decides instead of the variables when a plugin is
    known before the group is joined (one built in code says so only through its fields, not the environment).
    """
    if requested:
        return requested
    if device_type not in _BACKEND_FOR_DEVICE:
        raise ConfigError(f"hasten does not know the process-group backend of the {device_type!r} device; pass "
                          "Accelerator(kwargs_handlers=[InitProcessGroupKwargs(backend=...)]) or PartialState(backend=...)")
    backend = _BACKEND_FOR_DEVICE[device_type]
    if fsdp_cpu_tensors is None:
        fsdp_cpu_tensors = env_flag("USE_FSDP", env=env) and _fsdp_meets_cpu_tensors(env)
    if backend in ("nccl", "xccl") and fsdp_cpu_tensors:
        return f"{device_type}:{backend},cpu:gloo"
    return backend


def _fsdp_meets_cpu_tensors(env: Mapping[str, str] | None = None) -> bool:
    """`FSDP_OFFLOAD_PARAMS` on or `FSDP_STATE_DICT_TYPE=FULL_STATE_DICT` (Accelerate's variables, which
    `hasten launch --fsdp_offload_params / --fsdp_state_dict_type` export)."""
    env = os.environ if env is None else env
    text = env.get("FSDP_OFFLOAD_PARAMS", "")
    try:
        offload = bool(text) and parse_bool(text)
    except ValueError:
        raise ConfigError(
            f"environment variable FSDP_OFFLOAD_PARAMS={text!r} is not a boolean; set it to true or false"
        ) from None
    return offload or env.get("FSDP_STATE_DICT_TYPE", "").upper() == "FULL_STATE_DICT"


def distributed_type_for(device_type: str, world_size: int, launched: bool):
    """`DistributedType` for a device kind and process count (N CPU processes are MULTI_CPU, no flag needed)."""
    from ..core.enums import DistributedType

    if world_size <= 1 and not launched:
        return DistributedType.NO
    known = {
        "cuda": DistributedType.MULTI_GPU, "xpu": DistributedType.MULTI_XPU, "npu": DistributedType.MULTI_NPU,
        "hpu": DistributedType.MULTI_HPU, "mlu": DistributedType.MULTI_MLU, "musa": DistributedType.MULTI_MUSA,
        "sdaa": DistributedType.MULTI_SDAA, "neuron": DistributedType.MULTI_NEURON,
        "mps": DistributedType.MULTI_CPU, "cpu": DistributedType.MULTI_CPU,
    }
    if device_type not in known:
        raise ConfigError(f"several processes on the {device_type!r} device: hasten knows no distributed type for it "
                          f"(known: {', '.join(sorted(known))})")
    return known[device_type]

