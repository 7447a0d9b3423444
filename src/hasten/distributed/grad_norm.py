"""Gradient clipping when gradients are split over processes: DTensor pieces (FSDP2 shards, tensor-parallel
splits, on one mesh or several) and FSDP1's flat-parameter shards. The norm is the whole model's, the same on
every rank, and every gradient is scaled as `torch.nn.utils.clip_grad_norm_` scales an unsplit model's.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def clip_grad_norm_sharded_(parameters, max_norm: float, norm_type: float = 2.0, *, local_shards: bool = False):
    """Clip by the global norm and return it. `local_shards=True`: plain-tensor gradients are each process's
    disjoint shard of one flat parameter (FSDP1), so their norm is reduced over the default group; otherwise
    plain-tensor gradients are whole (replicated or unsharded) and count once."""
    from torch.distributed.tensor import DTensor

    params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
    groups: dict = {}  # device mesh (None: plain tensors) -> parameters whose gradients live there
    for param in params:
        if param.grad is not None:
            key = param.grad.device_mesh if isinstance(param.grad, DTensor) else None
            groups.setdefault(key, []).append(param)
    if not groups:
        return torch.tensor(0.0)
    norm_type = float(norm_type)
    norms = []
    for mesh, group in groups.items():
        norm = torch.nn.utils.get_total_norm([p.grad for p in group], norm_type)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        elif mesh is None and local_shards and dist.is_initialized():
            norm = _reduce_shard_norm(norm, norm_type)
        norms.append(norm.float())
    norms = torch.stack(norms)
    total = norms.max() if norm_type == float("inf") else norms.norm(norm_type)
    for group in groups.values():  # one call per mesh: a foreach over DTensors of different meshes fails
        torch.nn.utils.clip_grads_with_norm_(group, max_norm, total)
    return total


def _reduce_shard_norm(norm: torch.Tensor, norm_type: float) -> torch.Tensor:
    """The norm over every process's shard: every element lives on exactly one process."""
    home = norm.device
    norm = norm.to(reduction_device(norm.device, str(dist.get_backend())), copy=True)
    if norm_type == float("inf"):
        dist.all_reduce(norm, op=dist.ReduceOp.MAX)
        return norm.to(home)
    norm = norm ** norm_type
    dist.all_reduce(norm)
    return (norm ** (1.0 / norm_type)).to(home)


def reduction_device(device: torch.device, backend: str) -> torch.device:
    """Where a norm must be to be all-reduced over a group with `backend`: gradients offloaded to CPU memory give
    a CPU norm, which an NCCL-only group cannot reduce ("No backend type associated with device type cpu"); it
    goes to this process's current accelerator then. A group that serves CPU tensors (gloo,
    `"cuda:nccl,cpu:gloo"`) reduces it where it is."""
    if device.type != "cpu" or backend == "gloo" or "cpu:" in backend or backend in ("mpi", "fake"):
        return device
    accelerator = torch.accelerator.current_accelerator()
    if accelerator is None:
        return device
    return torch.device(accelerator.type, torch.accelerator.current_device_index())
