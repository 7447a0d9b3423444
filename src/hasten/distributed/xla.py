"""torch_xla's runtime as hasten uses it: the device, the replicas, step marking and the collectives.

Only this module (and `backends/xla/`, `data/xla_loader.py`) imports torch_xla, on first use: `import hasten`
never does. Replicas of one run may be threads of one process (`xmp.spawn` on TPU v2/v3 and on the CPU device)
or processes (TPU v4+): every collective here goes through torch_xla, never torch.distributed, which an XLA run
does not initialise.
"""

from __future__ import annotations

import contextlib
import importlib
import pickle
import threading

import torch

from ..core.errors import HangDetectedError, NotSupportedYetError

# Set by PartialState when it chooses the XLA device (all replicas of a process are XLA replicas).
ACTIVE = False


def modules():
    """(torch_xla, xla_model, runtime), imported on first use with an install hint."""
    try:
        torch_xla = importlib.import_module("torch_xla")
        xm = importlib.import_module("torch_xla.core.xla_model")
        xr = importlib.import_module("torch_xla.runtime")
    except ImportError as error:
        raise NotSupportedYetError(
            f"the XLA device needs torch_xla ({error}); install it with `pip install torch_xla` matching your torch"
        ) from None
    return torch_xla, xm, xr


def device() -> torch.device:
    torch_xla, _, _ = modules()
    return torch_xla.device()


def world_size() -> int:
    return modules()[2].world_size()


def global_ordinal() -> int:
    return modules()[2].global_ordinal()


def local_ordinal() -> int:
    return modules()[2].local_ordinal()


def replicated() -> bool:
    """Whether this run has more than one XLA replica (collectives then cross replicas)."""
    return ACTIVE and world_size() > 1


def mark_step() -> None:
    """Cut the lazy graph here and run it (Accelerate's `xm.mark_step()`)."""
    modules()[1].mark_step()


def to_cpu(data):
    """A copy of a nested structure with every XLA tensor moved to the CPU (one transfer after the step is cut);
    what safetensors and pickle can write."""
    mark_step()
    copies = {}  # one copy per tensor, so tied weights stay one tensor (and safetensors keeps one of them)

    def move(value):
        if isinstance(value, torch.Tensor) and value.device.type == "xla":
            if id(value) not in copies:
                copies[id(value)] = value.cpu()
            return copies[id(value)]
        return value

    return torch.utils._pytree.tree_map(move, data)


# -- replicas that are threads of one process (torch_xla's CPU device) ------------------------------------------
# On the CPU device, XLA runs a collective as an in-process rendezvous of the replica threads, and that rendezvous
# ends the whole process (std::exit; "Termination timeout ... of 10 seconds exceeded. Exiting to ensure a consistent
# program state") when one replica arrives more than ~15 s (a 5 s warning, then 10 s) after the other. Nothing
# can raise those limits, and one replica falls that far behind whenever the machine is busy: each compiles its
# own graphs, replica 0 alone writes checkpoints. The run then died without a Python traceback (pjrt.spawn reports
# a BrokenProcessPool). So on that device every collective is taken alone, with the replicas lined up first:
# run what is pending (this replica's own work, no collective in it), wait at a host barrier of the replica
# threads (no time limit there), then build and run the collective at once. Each collective costs two extra step
# cuts, on the CPU device only; a TPU's collectives keep their place in the step's graph.
BARRIER_TIMEOUT = 900.0  # s: a replica that never comes (it died outside hasten's launcher) fails the others
_barriers: dict = {}
_barriers_lock = threading.Lock()


def threaded_replicas() -> bool:
    """Whether this run's replicas are threads of this one process on the CPU device (xmp.spawn runs one thread
    per device it addresses; every CPU device is this process's)."""
    return replicated() and modules()[2].device_type() == "CPU" and modules()[2].addressable_device_count() > 1


def _barrier() -> threading.Barrier:
    # One per process, never renewed: xmp.spawn runs the replica threads of a run in a fresh process, and once a
    # replica has failed every later collective of that run must fail too.
    with _barriers_lock:
        return _barriers.setdefault(world_size(), threading.Barrier(world_size()))


def abandon() -> None:
    """A replica thread failed: the others raise at the host barrier (now, or when they reach it) instead of
    waiting for it."""
    _barrier().abort()


def settle() -> None:
    """Cut the step and wait until this replica's device has run it."""
    torch_xla, xm, _ = modules()
    torch_xla.sync()
    xm.wait_device_ops(xm.xla_real_devices([str(torch_xla.device())]))  # its runtime name (CPU:0), not xla:0


@contextlib.contextmanager
def lined_up():
    """Around a collective: on the CPU device, the replicas meet before it and it runs right after (see above);
    elsewhere nothing happens."""
    if not threaded_replicas():
        yield
        return
    settle()
    try:
        _barrier().wait(BARRIER_TIMEOUT)
    except threading.BrokenBarrierError:
        raise HangDetectedError(
            f"XLA replica {global_ordinal()}: another replica failed or did not reach this collective within "
            f"{BARRIER_TIMEOUT:.0f} s (its own error is printed above)") from None
    yield
    settle()


# -- collectives (every replica calls each, in the same order) ---------------------------------------------------
def all_gather(tensor: torch.Tensor) -> torch.Tensor:
    """Every replica's tensor, concatenated along dim 0."""
    xm = modules()[1]
    if tensor.ndim == 0:
        tensor = tensor[None]
    with lined_up():
        return xm.all_gather(tensor, dim=0)


def all_reduce(tensor: torch.Tensor, reduction: str, scale: float = 1.0) -> torch.Tensor:
    """A reduced copy: `max`, or a sum (`mean` divides it by the replicas, as the torch.distributed path does)."""
    xm = modules()[1]
    out = tensor.clone()
    factor = scale / world_size() if reduction == "mean" else scale
    all_reduce_([out], xm.REDUCE_MAX if reduction == "max" else xm.REDUCE_SUM, factor)
    return out


def all_reduce_(tensors: list, reduce_type: str, scale: float = 1.0) -> None:
    """`tensors` reduced in place across replicas (torch_xla's reduce type names), times `scale`."""
    with lined_up():
        modules()[1].all_reduce(reduce_type, tensors, scale=scale)


def broadcast_(tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
    """`tensor` overwritten in place with replica `src`'s."""
    with lined_up():
        modules()[1].collective_broadcast([tensor], root_ordinal=src)
    return tensor


def all_gather_objects(value) -> list:
    """Every replica's picklable `value`, in ordinal order: the pickles travel as one padded byte tensor each."""
    payload = torch.frombuffer(bytearray(pickle.dumps(value)), dtype=torch.uint8)
    here = device()
    sizes = all_gather(torch.tensor([payload.numel()], dtype=torch.int64, device=here)).cpu().tolist()
    padded = torch.zeros(max(sizes), dtype=torch.uint8)
    padded[: payload.numel()] = payload
    gathered = all_gather(padded.to(here)[None]).cpu()
    return [pickle.loads(gathered[rank, :size].numpy().tobytes()) for rank, size in enumerate(sizes)]


def broadcast_object(value, src: int = 0):
    return all_gather_objects(value)[src]


def rendezvous(tag: str) -> None:
    """Wait until every replica reaches `tag`."""
    with lined_up():
        modules()[1].rendezvous(tag)
