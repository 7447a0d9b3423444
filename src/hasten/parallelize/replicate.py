"""Layout step: replicas. The whole model on every process, its gradients averaged by DDP's all-reduce."""

from __future__ import annotations


def apply_ddp(model, ddp_kwargs, device):
    """`model` inside `DistributedDataParallel` with the script's `DistributedDataParallelKwargs` (and its comm hook);
    a model with nothing to train stays as it is."""
    from torch.nn.parallel import DistributedDataParallel

    if not any(p.requires_grad for p in model.parameters()):
        return model
    kwargs = ddp_kwargs.to_kwargs() if ddp_kwargs is not None else {}
    if device.type != "cpu" and device.index is not None:
        kwargs.setdefault("device_ids", [device.index])
        kwargs.setdefault("output_device", device.index)
    model = DistributedDataParallel(model, **kwargs)
    if ddp_kwargs is not None:
        ddp_kwargs.register_comm_hook(model)
    return model
