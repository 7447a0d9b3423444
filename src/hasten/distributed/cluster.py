"""Who am I, how many of us are there, and on which device? Pure functions over an environment mapping.

Everything here takes the environment as an argument (default `os.environ`) so that cluster detection is
unit-tested with plain dicts. hasten reads its own `HASTEN_*` variables and Accelerate's `ACCELERATE_*`
ones; when both are set, hasten's win.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Callable, Mapping

from ..core.errors import ConfigError

_TRUE = {"y", "yes", "t", "true", "on", "1"}
_FALSE = {"n", "no", "f", "false", "off", "0"}


# The one boolean parser and the one integer parser of hasten: flags, config files, environment variables,
# plugins and the questionnaire all read text through these two, so "yes"/"1"/"on" mean the same everywhere.


def parse_bool(value) -> bool:
    """True/False from a bool or from y/yes/t/true/on/1 and n/no/f/false/off/0 (any case); else ValueError."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"invalid truth value {value!r}: use one of {sorted(_TRUE)} or {sorted(_FALSE)}")


def parse_int(value, minimum: int | None = None, maximum: int | None = None) -> int:
    """A whole number from an int, a whole float or its text, within [minimum, maximum]; else ValueError."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not an integer")
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError(f"{value!r} is not an integer")
        value = int(value)
    if not isinstance(value, int):
        try:
            value = int(str(value).strip())
        except ValueError:
            raise ValueError(f"{value!r} is not an integer") from None
    if minimum is not None and value < minimum:
        if value < 0 <= minimum:
            raise ValueError(f"{value} is negative; give {minimum} or more")
        raise ValueError(f"{value} is not allowed; give {minimum} or more")
    if maximum is not None and value > maximum:
        raise ValueError(f"{value} is too large; give {maximum} or less")
    return value


def str_to_bool(value, to_bool: bool = False):
    """Parse a truthy/falsy string the way Accelerate does (1/0, or True/False with `to_bool`)."""
    result = parse_bool(str(value))
    return result if to_bool else int(result)


def env_name_used(name: str, env: Mapping[str, str] | None = None) -> str | None:
    """The variable that supplies setting `name` (`HASTEN_<name>` first, then `ACCELERATE_<name>`)."""
    env = os.environ if env is None else env
    for prefix in ("HASTEN_", "ACCELERATE_"):
        if prefix + name in env:
            return prefix + name
    return None


def env_value(name: str, default=None, env: Mapping[str, str] | None = None):
    """The value of setting `name` from `HASTEN_<name>` or `ACCELERATE_<name>`, else `default`."""
    env = os.environ if env is None else env
    key = env_name_used(name, env)
    return default if key is None else env[key]


def env_flag(name: str, default: bool = False, env: Mapping[str, str] | None = None) -> bool:
    """A boolean setting; a value that is neither truthy nor falsy is a ConfigError naming the variable."""
    env = os.environ if env is None else env
    key = env_name_used(name, env)
    if key is None:
        return default
    try:
        return parse_bool(env[key])
    except ValueError:
        raise ConfigError(
            f"environment variable {key}={env[key]!r} is not a boolean; set it to 1/0, true/false or yes/no"
        ) from None


def parse_flag_from_env(key: str, default: bool = False) -> bool:
    """Accelerate's helper: read one exact variable as a boolean."""
    value = os.environ.get(key)
    return default if value is None else parse_bool(value)


def parse_choice_from_env(key: str, default: str = "no") -> str:
    return os.environ.get(key, str(default))


def get_int_from_env(env_keys, default: int) -> int:
    """The first non-negative integer among `env_keys`, else `default`."""
    for key in env_keys:
        text = os.environ.get(key, "-1")
        try:
            value = parse_int(text)
        except ValueError:
            raise ConfigError(f"environment variable {key}={text!r} must be an integer") from None
        if value >= 0:
            return value
    return default


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


def _first_slurm_host(nodelist: str) -> str:
    """First host of a SLURM node list such as `gpu[03-05,09],cpu1` -> `gpu03`."""
    match = re.match(r"([^,\[]+)(\[([^\]]+)\])?", nodelist.strip())
    if not match:
        return nodelist
    prefix, _, ranges = match.groups()
    if not ranges:
        return prefix
    return prefix + ranges.split(",")[0].split("-")[0]


def _slurm_tasks_on_first_node(spec: str) -> int:
    """`SLURM_STEP_TASKS_PER_NODE` looks like `4(x2),3`; the count on this job's nodes is the first number."""
    match = re.match(r"(\d+)", spec or "")
    return int(match.group(1)) if match else 1


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
            local_world = _slurm_tasks_on_first_node(env.get("SLURM_STEP_TASKS_PER_NODE", env.get("SLURM_TASKS_PER_NODE", "")))
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or ""
        info = ClusterInfo(
            launcher="slurm",
            rank=_int_var(env, ["SLURM_PROCID"], 0),
            world_size=world,
            local_rank=_int_var(env, ["SLURM_LOCALID"], 0),
            local_world_size=local_world,
            node_rank=_int_var(env, ["SLURM_NODEID"], 0),
            master_addr=master_addr or (_first_slurm_host(nodelist) if nodelist else "127.0.0.1"),
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


def choose_backend(device_type: str, requested: str | None = None) -> str:
    """The collective backend for a device kind: NCCL for CUDA, gloo for CPU, or what the user asked for."""
    if requested:
        return requested
    if device_type not in _BACKEND_FOR_DEVICE:
        raise ConfigError(f"hasten does not know the process-group backend of the {device_type!r} device; pass "
                          "Accelerator(kwargs_handlers=[InitProcessGroupKwargs(backend=...)]) or PartialState(backend=...)")
    return _BACKEND_FOR_DEVICE[device_type]


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


# -- NUMA affinity (`--enable_cpu_affinity`) ------------------------------------------------------------------------


def parse_cpu_list(text: str) -> list[int]:
    """The CPUs of a sysfs list such as `0-7,16-23`."""
    cpus = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        first, _, last = part.partition("-")
        cpus.extend(range(parse_int(first), parse_int(last or first) + 1))
    return cpus


def numa_cpus(device_type: str, pci_bus_id: str | None, local_index: int, root: str = "/sys") -> list[int] | None:
    """The CPUs of the NUMA node this process belongs to, or None when the machine has no NUMA information.

    A GPU process belongs to its GPU's node (`<root>/bus/pci/devices/<pci id>/numa_node`); a CPU process to node
    `local_index % nodes`, so the processes of one machine spread over its nodes.
    """
    nodes_dir = os.path.join(root, "devices", "system", "node")
    try:
        nodes = sorted(int(name[4:]) for name in os.listdir(nodes_dir) if name.startswith("node") and name[4:].isdigit())
    except OSError:
        return None
    if not nodes:
        return None
    node = nodes[local_index % len(nodes)]
    if device_type != "cpu" and pci_bus_id:
        try:
            with open(os.path.join(root, "bus", "pci", "devices", pci_bus_id.lower(), "numa_node")) as handle:
                found = int(handle.read().strip())
        except (OSError, ValueError):
            return None
        if found < 0:  # the kernel does not know the GPU's node (single-node machines report -1)
            return None
        node = found
    try:
        with open(os.path.join(nodes_dir, f"node{node}", "cpulist")) as handle:
            return parse_cpu_list(handle.read())
    except OSError:
        return None


def pin_to_numa_node(device_type: str, pci_bus_id: str | None, local_index: int, root: str = "/sys") -> list[int] | None:
    """Restrict this process to its NUMA node's CPUs (those it may use at all); returns them, or None if unchanged."""
    cpus = numa_cpus(device_type, pci_bus_id, local_index, root)
    if not cpus or not hasattr(os, "sched_setaffinity"):
        return None
    allowed = sorted(set(cpus) & os.sched_getaffinity(0))
    if not allowed:
        return None
    os.sched_setaffinity(0, allowed)
    return allowed
