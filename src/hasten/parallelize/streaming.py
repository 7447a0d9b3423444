"""Filling an FSDP2-sharded model from the whole tensors that rank 0 holds, one tensor at a time.

Why not torch's `set_model_state_dict(broadcast_from_rank0=True)`: it demands that the model's tensors live on one
device, and FSDP2 with CPU offload keeps the parameter shards in CPU memory and the buffers on the GPU ("Multiple
devices found" at `prepare()` for any model with a persistent buffer); it treats a tensor still on the meta device
as a reason to *replace* the module's parameters (`assign=True`), which cuts them off from FSDP and the optimizer;
and called once per tensor, as streaming needs, it walks the whole model every time (quadratic in the number of
tensors). Here each tensor is broadcast on the device the default group serves best and each process copies its
own slice into the tensor it already has: one walk, no device rule, nothing replaced.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..distributed import control


def transport_device(device: torch.device) -> torch.device:
    """Where whole tensors travel: the accelerator when the default group has one (NCCL), else CPU memory."""
    backend = str(dist.get_backend())
    if device.type in ("cpu", "meta") or backend == "gloo":
        return torch.device("cpu")
    return device


def _sendable_as_is(source: torch.Tensor, target: torch.Tensor, carrier: torch.device) -> bool:
    return source.dtype == target.dtype and source.device == carrier and source.is_contiguous()


def stream_from_rank0(targets: dict, full: dict, device: torch.device, *, consume: bool = False) -> list:
    """Copy rank 0's `full[name]` into every process's `targets[name]` (a DTensor shard or a whole tensor), for
    every name rank 0 has; the other ranks pass `{}`. `targets` must list the same names in the same order on
    every rank. `consume`: free each of rank 0's tensors once sent (they are the user's own, now replaced), so
    rank 0 never holds two copies. Returns the names that rank 0 had and the model did not."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    is_source = dist.get_rank() == 0
    names = set(control.broadcast_object(list(full) if is_source else None))
    several = dist.get_world_size() > 1
    carrier = transport_device(device)
    with torch.no_grad():
        for name, target in targets.items():
            if name not in names:
                continue
            if is_source:
                source = full[name]
                if tuple(source.shape) != tuple(target.shape):
                    raise ValueError(f"{name}: rank 0 holds shape {tuple(source.shape)}, the model {tuple(target.shape)}")
            whole = source if is_source and not several else None
            if several:
                if is_source and _sendable_as_is(source, target, carrier):
                    whole = source.detach()  # no second copy on rank 0: broadcast reads its buffer in place
                else:
                    whole = torch.empty(target.shape, dtype=target.dtype, device=carrier)
                    if is_source:
                        whole.copy_(source)
                dist.broadcast(whole, src=0)
            if isinstance(target, DTensor):
                shape, offset = compute_local_shape_and_global_offset(target.shape, target.device_mesh,
                                                                      target.placements)
                piece = whole[tuple(slice(o, o + s) for s, o in zip(shape, offset))]
                target.to_local().copy_(piece)
            else:
                target.copy_(whole)
            if is_source and consume:
                source.data = torch.empty(0, dtype=source.dtype)  # the user's optimizer may still reference it
            del whole
    return [name for name in names if name not in targets]
