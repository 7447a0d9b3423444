"""The control plane: collectives that carry flags, counts and decisions every rank must share.

Two kinds of collective run in a hasten job (see docs/architecture.md, "Control plane and data plane"):

- **data**: gradients, parameters, activations, the user's tensors in `gather`/`reduce`/`broadcast`. They run on
  the default group, on the accelerator's backend (NCCL on CUDA), with tensors on the process's device.
- **control**: "did any rank see a meta parameter?", "did every rank's write succeed?", barriers, a checkpoint's
  token. They run on `control_group()`, a group that serves CPU tensors whatever the accelerator: the default
  group when it is gloo (CPU runs), else a gloo group made beside it. A control tensor is made on the CPU, so a
  control collective never depends on where a tensor happened to be created (NCCL serves no CPU tensor:
  "No backend type associated with device type cpu").

`tests/distributed/test_control_plane_guard.py` reads `src/` and fails on a collective whose tensor is made
without an explicit device outside the control group.
"""

from __future__ import annotations

from typing import Any

import torch

from . import xla

__all__ = ["any_rank", "all_gather_objects", "barrier", "broadcast_object", "control_group", "max_across", "several_processes",
           "reset"]

_group = None  # the gloo group beside a non-gloo default group
_for_default = None  # the default group `_group` was made beside (a new default group needs a new one)


def _serves_cpu(backend: str) -> bool:
    """Whether a group's backend string serves CPU tensors ("gloo", "cpu:gloo,cuda:nccl", ...)."""
    backend = str(backend)
    return backend == "gloo" or "cpu:gloo" in backend or backend in ("mpi", "fake")


def control_group(timeout=None):
    """The group control collectives use: `None` (the default group) when that serves CPU tensors, else a gloo
    group over the same processes, made once per default group.

    Made eagerly by `bootstrap.init_process_group` right after the default group, so every rank makes it at the
    same point; made here, lazily, when the default group came from elsewhere (the user's own
    `init_process_group`). Every rank must then reach its first control collective together, which holds because
    a control collective is itself called by every rank.
    """
    global _group, _for_default
    import torch.distributed as dist

    if not dist.is_initialized():
        return None
    default = dist.distributed_c10d._get_default_group()
    if _serves_cpu(dist.get_backend()):
        return None
    if _group is None or _for_default is not default:
        from datetime import timedelta

        from ..config.resolve import runtime_value

        # The one collective timeout (bootstrap.collective_timeout reads the same setting).
        if timeout is None:  # bootstrap hands over the one it used (InitProcessGroupKwargs(timeout=) included)
            timeout = timedelta(seconds=float(runtime_value("collective_timeout", None).value))
        _group = dist.new_group(backend="gloo", timeout=timeout)
        _for_default = default
    return _group


def reset() -> None:
    """Forget the control group (after the default group is destroyed)."""
    global _group, _for_default
    _group = _for_default = None


def several_processes() -> bool:
    import torch.distributed as dist

    if xla.ACTIVE:  # XLA replicas share decisions through torch_xla (no torch.distributed group exists)
        return xla.replicated()
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def max_across(value: int) -> int:
    """The largest of every rank's integer (the value itself in one process)."""
    if not several_processes():
        return int(value)
    if xla.ACTIVE:
        return max(int(v) for v in xla.all_gather_objects(int(value)))
    import torch.distributed as dist

    tensor = torch.tensor([int(value)], dtype=torch.int64, device="cpu")
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=control_group())
    return int(tensor.item())


def any_rank(flag: bool) -> bool:
    """Whether `flag` holds on some process; every process gets the same answer."""
    return bool(max_across(int(bool(flag))))


def all_gather_objects(value: Any) -> list:
    """Every rank's picklable `value`, in rank order (`[value]` in one process)."""
    if not several_processes():
        return [value]
    if xla.ACTIVE:
        return xla.all_gather_objects(value)
    import torch.distributed as dist

    values = [None] * dist.get_world_size()
    dist.all_gather_object(values, value, group=control_group())
    return values


def broadcast_object(value: Any, src: int = 0) -> Any:
    """Rank `src`'s picklable `value` on every rank."""
    if not several_processes():
        return value
    if xla.ACTIVE:
        return xla.broadcast_object(value, src)
    import torch.distributed as dist

    box = [value]
    dist.broadcast_object_list(box, src=src, group=control_group())
    return box[0]


def barrier() -> None:
    """Wait until every process reaches this point, on the control group (no device is involved)."""
    if several_processes() and xla.ACTIVE:
        xla.rendezvous("hasten.control.barrier")
    elif several_processes():
        import torch.distributed as dist

        dist.barrier(group=control_group())
