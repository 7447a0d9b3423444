"""torch_xla's runtime as hasten uses it: the device, the replicas, step marking and the collectives.

Only this module (and `backends/xla/`, `data/xla_loader.py`) imports torch_xla, on first use: `import hasten`
never does. Replicas of one run may be threads of one process (`xmp.spawn` on TPU v2/v3 and on the CPU device)
or processes (TPU v4+): every collective here goes through torch_xla, never torch.distributed, which an XLA run
does not initialise.
"""

from __future__ import annotations

import importlib
import pickle

import torch

from ..core.errors import NotSupportedYetError

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


# -- collectives (every replica calls each, in the same order) ---------------------------------------------------
def all_gather(tensor: torch.Tensor) -> torch.Tensor:
    """Every replica's tensor, concatenated along dim 0."""
    xm = modules()[1]
    if tensor.ndim == 0:
        tensor = tensor[None]
    return xm.all_gather(tensor, dim=0)


def all_reduce(tensor: torch.Tensor, reduction: str, scale: float = 1.0) -> torch.Tensor:
    """A reduced copy: `max`, or a sum (`mean` divides it by the replicas, as the torch.distributed path does)."""
    xm = modules()[1]
    out = tensor.clone()
    factor = scale / world_size() if reduction == "mean" else scale
    xm.all_reduce(xm.REDUCE_MAX if reduction == "max" else xm.REDUCE_SUM, [out], scale=factor)
    return out


def broadcast_(tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
    """`tensor` overwritten in place with replica `src`'s."""
    xm = modules()[1]
    xm.collective_broadcast([tensor], root_ordinal=src)
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
    modules()[1].rendezvous(tag)
