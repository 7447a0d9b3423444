"""NUMA affinity (`--enable_cpu_affinity`, Accelerate's `set_numa_affinity`): pin a process to its node's CPUs.

Read from sysfs, so it needs no vendor library and works for CPU processes too: a GPU process belongs to its
GPU's node, found through the GPU's PCI address (which follows CUDA_VISIBLE_DEVICES, as NVML's index does not).
"""

from __future__ import annotations

import os

from ..core.env import parse_int

# where the kernel describes the machine; tests point it at a fake tree
SYSFS = "/sys"


def parse_cpu_list(text: str) -> list[int]:
    """The CPUs of a sysfs list such as `0-7,16-23`."""
    cpus = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        first, _, last = part.partition("-")
        cpus.extend(range(parse_int(first), parse_int(last or first) + 1))
    return cpus


def numa_cpus(device_type: str, pci_bus_id: str | None, local_index: int, root: str | None = None) -> list[int] | None:
    """The CPUs of the NUMA node this process belongs to, or None when the machine has no NUMA information.

    A GPU process belongs to its GPU's node (`<root>/bus/pci/devices/<pci id>/numa_node`); a CPU process to node
    `local_index % nodes`, so the processes of one machine spread over its nodes.
    """
    root = SYSFS if root is None else root
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


def pin_to_numa_node(device_type: str, pci_bus_id: str | None, local_index: int, root: str | None = None) -> list[int] | None:
    """Restrict this process to its NUMA node's CPUs (those it may use at all); returns them, or None if unchanged."""
    cpus = numa_cpus(device_type, pci_bus_id, local_index, root)
    if not cpus or not hasattr(os, "sched_setaffinity"):
        return None
    allowed = sorted(set(cpus) & os.sched_getaffinity(0))
    if not allowed:
        return None
    os.sched_setaffinity(0, allowed)
    return allowed


def pci_bus_id(device) -> str | None:
    """`0000:3b:00.0` for a CUDA device (its NUMA node is found through it), else None."""
    if device.type != "cuda":
        return None
    import torch

    props = torch.cuda.get_device_properties(device)
    if not hasattr(props, "pci_bus_id"):
        return None
    return f"{getattr(props, 'pci_domain_id', 0):04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
