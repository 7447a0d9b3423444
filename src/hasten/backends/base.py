"""The one interface every way of distributing a model implements.

The facade (`Accelerator`) never asks which backend it has; it asks the backend. A new backend is one
module in this package plus one line in `REGISTRY` (see `__init__.py`).
"""

from __future__ import annotations

import contextlib

import torch

from .unwrap import unwrap_model


class Backend:
    """Single-process defaults; distributed backends override what differs."""

    name = "base"
    #: Whether `clip_grad_value_` is meaningful (not for sharded parameters).
    supports_clip_grad_value = True
    #: Whether `save_state`/`load_state` leave model and optimizer files to `save_checkpoint_files` /
    #: `load_checkpoint_files` (sharded checkpoints); False: hasten writes them from the state dicts below.
    writes_own_checkpoint_files = False
    #: Whether `backward` divides the loss by the accumulation steps itself (DeepSpeed's engine does).
    scales_loss_itself = False
    #: Whether the backend applies mixed precision itself (then hasten's autocast and scaler stay off).
    handles_mixed_precision = False
    #: Accelerate's `accelerator.deepspeed_engine_wrapped`: the engine a backend drives, if it has one.
    engine_wrapper = None

    def __init__(self, state, ddp_kwargs=None, plugin=None):
        self.state = state
        self.ddp_kwargs = ddp_kwargs
        self.plugin = plugin

    # -- preparing objects ----------------------------------------------------------------------------------
    def prepare_model(self, model: torch.nn.Module, device_placement: bool, evaluation_mode: bool) -> torch.nn.Module:
        """Place (and, for distributed backends, wrap) one model."""
        if device_placement:
            model = model.to(self.state.device)
        return model

    def prepare_together(self, models: list, optimizers: list, schedulers=(), data_loaders=(), split_batches=False,
                         accumulation_steps: int = 1) -> None:
        """Hook for backends that must see everything one `prepare` call got at once (sharding, an engine built
        from model, optimizer, scheduler and batch size together); default: nothing."""

    def wrap_optimizer(self, optimizer, device_placement: bool = True, scaler=None):
        from ..optimizer import AcceleratedOptimizer

        return AcceleratedOptimizer(optimizer, device_placement=device_placement, scaler=scaler)

    def wrap_scheduler(self, scheduler, optimizers: list, step_with_optimizer: bool = True, split_batches: bool = False):
        """Wrap a scheduler so it steps with the prepared optimizer that owns its optimizer."""
        from ..errors import ConfigError
        from ..scheduler import AcceleratedScheduler

        target = getattr(scheduler, "optimizer", None)
        owners = [opt for opt in optimizers if getattr(opt, "optimizer", None) is target]
        if target is not None and not owners:
            raise ConfigError(
                f"prepare() got a {type(scheduler).__name__} whose optimizer was not prepared: pass the optimizer "
                "to prepare() as well (in the same call or before)"
            )
        return AcceleratedScheduler(scheduler, owners or optimizers, step_with_optimizer=step_with_optimizer,
                                    split_batches=split_batches)

    def accumulation_steps(self, steps: int, source: str) -> int:
        """Agree the Accelerator's gradient accumulation steps with the backend's own setting, if it has one."""
        return steps

    def free_memory(self) -> None:
        """Release what the backend holds for prepared objects (`accelerator.free_memory()`)."""

    # -- the training step ----------------------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, scaler=None, **kwargs) -> None:
        if scaler is not None:
            scaler.scale(loss).backward(**kwargs)
        else:
            loss.backward(**kwargs)

    def no_sync(self, model):
        """Context in which backward does not synchronise gradients across processes."""
        return contextlib.nullcontext()

    def trigger_sync_in_backward(self, model):
        return contextlib.nullcontext()

    def clip_grad_norm_(self, parameters, max_norm: float, norm_type: float = 2.0):
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)

    # -- state for checkpoints ------------------------------------------------------------------------------
    def model_state_dict(self, model: torch.nn.Module) -> dict:
        """The state dict `save_state` writes (wrapper prefixes kept, as Accelerate does)."""
        return model.state_dict()

    def load_model_state_dict(self, model: torch.nn.Module, state_dict: dict, strict: bool = True):
        return model.load_state_dict(state_dict, strict=strict)

    def full_state_dict(self, model: torch.nn.Module, unwrap: bool = True) -> dict:
        """A complete, unsharded state dict for `save_model` / `get_state_dict`."""
        return (self.unwrap_model(model) if unwrap else model).state_dict()

    def optimizer_state_dict(self, optimizer, model=None) -> dict:
        return optimizer.state_dict()

    def load_optimizer_state_dict(self, optimizer, state_dict: dict, model=None) -> None:
        optimizer.load_state_dict(state_dict)

    def save_checkpoint_files(self, models: list, optimizers: list, folder: str, **kwargs) -> list:
        """Write model and optimizer state into `folder` on every process (a collective); return the names of
        the files or folders this process wrote, relative to `folder`. Only used when `writes_own_checkpoint_files`."""
        raise NotImplementedError(f"the {self.name} backend does not write its own checkpoint files")

    def load_checkpoint_files(self, models: list, optimizers: list, folder: str, **kwargs) -> None:
        """Inverse of `save_checkpoint_files`."""
        raise NotImplementedError(f"the {self.name} backend does not read its own checkpoint files")

    # -- unwrapping -----------------------------------------------------------------------------------------
    def unwrap_model(self, model, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True):
        return unwrap_model(model, keep_fp32_wrapper=keep_fp32_wrapper, keep_torch_compile=keep_torch_compile)
