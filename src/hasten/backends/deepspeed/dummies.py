"""`DummyOptim` and `DummyScheduler`: what a script passes to `prepare` when the DeepSpeed config defines the
optimizer or the scheduler; DeepSpeed builds the real ones (backends/deepspeed/backend.py swaps them in)."""

from __future__ import annotations

import torch

from ...core.errors import ConfigError


class DummyOptim(torch.optim.Optimizer):
    """Stands for the optimizer in the DeepSpeed config's `"optimizer"` section; DeepSpeed builds the real one.

    A real (empty-state) torch optimizer over `params`, so `prepare` recognises it and its `param_groups` tell
    DeepSpeed which parameters to train; `lr` and `weight_decay` fill the config's `"auto"` values.
    """

    def __init__(self, params, lr: float = 0.001, weight_decay: float = 0, **kwargs):
        super().__init__(params, {"lr": lr, "weight_decay": weight_decay, **kwargs})
        self.params = self.param_groups
        self.lr = lr
        self.weight_decay = weight_decay
        self.kwargs = kwargs

    def step(self, closure=None):
        raise ConfigError("DummyOptim only stands for DeepSpeed's optimizer: pass it to accelerator.prepare() first")


class DummyScheduler:
    """Stands for the scheduler in the DeepSpeed config's `"scheduler"` section (or `lr_scheduler_callable`)."""

    def __init__(self, optimizer, total_num_steps=None, warmup_num_steps: int = 0, lr_scheduler_callable=None, **kwargs):
        self.optimizer = optimizer
        self.total_num_steps = total_num_steps
        self.warmup_num_steps = warmup_num_steps
        self.lr_scheduler_callable = lr_scheduler_callable
        self.kwargs = kwargs

    def step(self, *args, **kwargs):
        raise ConfigError("DummyScheduler only stands for DeepSpeed's scheduler: pass it to accelerator.prepare() first")

    def get_last_lr(self):
        return [group["lr"] for group in self.optimizer.param_groups]
