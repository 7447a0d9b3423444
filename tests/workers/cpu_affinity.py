"""Reports whether PartialState pinned this process to its NUMA node (tests/test_honoured_routes.py).

The call is watched rather than the CPU set: on a machine with one NUMA node the node holds every CPU, so the
pinning changes nothing visible; what `--enable_cpu_affinity` must do is reach the pinning in every process."""

import hasten.distributed.numa as numa
from hasten import PartialState

calls = []
original = numa.pin_to_numa_node


def watched(*args, **kwargs):
    calls.append(args)
    return original(*args, **kwargs)


numa.pin_to_numa_node = watched
state = PartialState()
print(f"RANK {state.process_index} PINNED {len(calls)}", flush=True)
