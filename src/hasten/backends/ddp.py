"""Data parallel: every process holds the whole model; gradients are averaged by DDP's all-reduce."""

from __future__ import annotations

import contextlib

import torch
from torch.nn.parallel import DistributedDataParallel

from ..parallelize.replicate import apply_ddp
from .base import Backend


class DDPBackend(Backend):
    name = "ddp"

    def prepare_model(self, model, device_placement, evaluation_mode):
        model = super().prepare_model(model, device_placement, evaluation_mode)
        if evaluation_mode:
            return model
        return apply_ddp(model, self.ddp_kwargs, self.state.device)  # the replicas step (parallelize/replicate.py)

    def no_sync(self, model):
        if isinstance(model, DistributedDataParallel):
            return model.no_sync()
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def trigger_sync_in_backward(self, model):
        """Force the next backward to all-reduce, after several forwards under `no_sync`."""
        if not isinstance(model, DistributedDataParallel):
            yield
            return
        saved_sync = model.require_backward_grad_sync
        saved_forward_sync = model.require_forward_param_sync
        model.require_backward_grad_sync = True
        model.require_forward_param_sync = True
        # DDP decides in forward whether backward reduces; re-arm its reducer for this backward.
        model.reducer.prepare_for_backward([])
        try:
            yield
        finally:
            model.require_backward_grad_sync = saved_sync
            model.require_forward_param_sync = saved_forward_sync

    def clip_grad_norm_(self, parameters, max_norm, norm_type=2.0):
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)
