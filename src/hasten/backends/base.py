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

    def prepare_together(self, models: list, optimizers: list) -> None:
        """Hook for backends that must see models and optimizers at once (sharding); default: nothing."""

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
