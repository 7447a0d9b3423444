"""Local SGD: each process takes optimizer steps on its own, and every `local_sgd_steps` steps the
processes replace their parameters by the average over all of them.

Gradients are never all-reduced inside the block (the model runs under `no_sync`), so a step costs no
communication; the price is that replicas drift apart between averages.
"""

from __future__ import annotations

import contextlib

import torch

from .checkpoint import async_save as background
from .core.enums import DistributedType
from .core.errors import ConfigError, NotSupportedYetError

# Plain data parallel: every process holds the whole model, so averaging parameters is meaningful.
_SUPPORTED = {
    DistributedType.NO, DistributedType.MULTI_CPU, DistributedType.MULTI_GPU, DistributedType.MULTI_XPU,
    DistributedType.MULTI_MLU, DistributedType.MULTI_HPU, DistributedType.MULTI_SDAA, DistributedType.MULTI_MUSA,
    DistributedType.MULTI_NPU, DistributedType.MULTI_NEURON,
}


class LocalSGD:
    """Context manager: `with LocalSGD(accelerator, model, local_sgd_steps=8) as local_sgd:` and call
    `local_sgd.step()` after each `optimizer.step()`. Leaving the block averages one last time."""

    def __init__(self, accelerator, model: torch.nn.Module, local_sgd_steps: int, enabled: bool = True):
        if accelerator.distributed_type not in _SUPPORTED:
            raise NotSupportedYetError(
                f"LocalSGD averages whole replicas and cannot run with {accelerator.distributed_type.value}; "
                "use plain data parallel (DDP) or drop LocalSGD"
            )
        if int(local_sgd_steps) < 1:
            raise ConfigError(f"LocalSGD needs local_sgd_steps >= 1, got {local_sgd_steps}")
        self.accelerator = accelerator
        self.model = model
        self.local_sgd_steps = int(local_sgd_steps)
        self.enabled = bool(enabled) and accelerator.distributed_type != DistributedType.NO
        self.num_steps = 0
        self._no_sync = contextlib.nullcontext()

    def __enter__(self):
        if self.enabled:
            self._no_sync = self.accelerator.no_sync(self.model)
            self._no_sync.__enter__()
        return self

    def __exit__(self, exc_type, exc_value, traceback):
        try:
            # After an exception the ranks may be out of step: a collective here could hang.
            if self.enabled and exc_type is None:
                self._sync_and_avg_model_params()
        finally:
            if self.enabled:
                self._no_sync.__exit__(exc_type, exc_value, traceback)

    def step(self) -> None:
        """Count one optimizer step; average the parameters on every `local_sgd_steps`-th."""
        self.num_steps += 1
        if self.enabled and self.num_steps % self.local_sgd_steps == 0:
            self._sync_and_avg_model_params()

    @torch.no_grad()
    def _sync_and_avg_model_params(self) -> None:
        """Replace each parameter by its mean over the processes: one all-reduce per dtype and device."""
        import torch.distributed as dist

        background.wait_for_staging()  # an async save_state may still be copying these parameters
        world = self.accelerator.num_processes
        buckets: dict = {}
        for param in self.accelerator.unwrap_model(self.model).parameters():
            if param.is_floating_point():  # an integer "parameter" has no mean of its own type
                buckets.setdefault((param.dtype, param.device), []).append(param)
        for params in buckets.values():
            flat = torch.cat([p.detach().reshape(-1) for p in params])
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
            flat /= world
            offset = 0
            for p in params:
                p.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
