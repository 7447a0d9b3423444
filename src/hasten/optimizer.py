"""`AcceleratedOptimizer`: an optimizer that steps only on synchronisation steps and knows about loss scaling."""

from __future__ import annotations

import inspect

import torch

from .checkpoint import async_save as background
from .core.nested import send_to_device
from .resilience import preemption
from .state import AcceleratorState, GradientState


def move_to_device(state, device):
    if isinstance(state, (list, tuple)):
        return type(state)(move_to_device(t, device) for t in state)
    if isinstance(state, dict):
        return type(state)({k: move_to_device(v, device) for k, v in state.items()})
    if isinstance(state, torch.Tensor):
        return state.to(device)
    return state


class AcceleratedOptimizer(torch.optim.Optimizer):
    """Wraps an optimizer so that `step()` and `zero_grad()` act only when gradients are synchronised
    (the last micro-step of an accumulation window), and `step()` goes through the fp16 scaler if any.
    """

    def __init__(self, optimizer, device_placement: bool = True, scaler=None):
        # No super().__init__: the wrapped optimizer owns param_groups and state.
        self.optimizer = optimizer
        self.scaler = scaler
        self.gradient_state = GradientState()
        self.device_placement = device_placement
        self._is_overflow = False
        self._accepts_set_to_none = "set_to_none" in inspect.signature(optimizer.zero_grad).parameters
        if device_placement and optimizer.state:
            # Optimizer state created before prepare() must follow the parameters to the device.
            device = AcceleratorState().device
            state_dict = move_to_device(optimizer.state_dict(), device)
            optimizer.load_state_dict(state_dict)

    @property
    def state(self):
        return self.optimizer.state

    @state.setter
    def state(self, state):
        self.optimizer.state = state

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, param_groups):
        self.optimizer.param_groups = param_groups

    @property
    def defaults(self):
        return self.optimizer.defaults

    @defaults.setter
    def defaults(self, defaults):
        self.optimizer.defaults = defaults

    def add_param_group(self, param_group):
        self.optimizer.add_param_group(param_group)

    def load_state_dict(self, state_dict):
        self.optimizer.load_state_dict(state_dict)

    def state_dict(self):
        return self.optimizer.state_dict()

    def zero_grad(self, set_to_none=None):
        if not self.gradient_state.sync_gradients:
            return
        if self._accepts_set_to_none:
            self.optimizer.zero_grad(set_to_none=True if set_to_none is None else set_to_none)
        elif set_to_none is not None:
            raise ValueError("`set_to_none` is not supported by the wrapped optimizer's zero_grad")
        else:
            self.optimizer.zero_grad()

    def train(self):
        if hasattr(self.optimizer, "train"):
            self.optimizer.train()

    def eval(self):
        if hasattr(self.optimizer, "eval"):
            self.optimizer.eval()

    def step(self, closure=None):
        if not self.gradient_state.sync_gradients:
            return None
        if background.staging is not None:  # an async save_state still copies the parameters: let it finish
            background.wait_for_staging()
        if preemption._active is not None:
            preemption._active.count_optimizer_step()
        if self.scaler is None:
            self._is_overflow = False
            return self.optimizer.step(closure) if closure is not None else self.optimizer.step()
        # The scaler skips the inner step when gradients overflowed; notice whether it ran.
        ran = []
        inner_step = self.optimizer.step
        patched_before = "step" in self.optimizer.__dict__  # e.g. by an LR scheduler

        def marked_step(*args, **kwargs):
            ran.append(True)
            return inner_step(*args, **kwargs)

        # An optimizer that unscales and skips inside its own step (`_step_supports_amp_scaling`: fused Adam/AdamW/
        # SGD) is always called by the scaler, so "did step() run" cannot tell a skipped step there; the scale can:
        # update() lowers it exactly when gradients overflowed. (Accelerate reads the marker only, and so reports
        # no skip, and steps the scheduler, on a fused optimizer's overflow.) One host sync, fused optimizers only.
        by_scale = getattr(self.optimizer, "_step_supports_amp_scaling", False) and self.scaler.is_enabled()
        scale_before = self.scaler.get_scale() if by_scale else None
        if by_scale:
            _share_overflow_before_fused_step(self.scaler, self.optimizer)
        self.optimizer.step = marked_step
        try:
            result = self.scaler.step(self.optimizer, closure) if closure is not None else self.scaler.step(self.optimizer)
            self.scaler.update()
        finally:
            if patched_before:
                self.optimizer.step = inner_step
            else:
                del self.optimizer.step
        self._is_overflow = self.scaler.get_scale() < scale_before if by_scale else not ran
        return result

    @property
    def step_was_skipped(self) -> bool:
        """True when the last step was skipped because fp16 gradients overflowed."""
        return self._is_overflow

    @property
    def is_overflow(self) -> bool:
        return self._is_overflow

    def __getstate__(self):
        return dict(self.__dict__)

    def __setstate__(self, state):
        self.__dict__.update(state)

    def __repr__(self):
        return f"AcceleratedOptimizer({self.optimizer!r})"


def _share_overflow_before_fused_step(scaler, optimizer) -> None:
    """torch's ShardedGradScaler (FSDP1) makes the ranks agree on an overflow inside `unscale_()`, which the scaler
    skips for a fused optimizer (the kernel unscales): a rank whose shard held the inf skipped the step while the
    others took it, leaving one model made of two steps. Unscaling first (one extra pass over the gradients,
    FSDP1 + fp16 + fused only) takes the path that all-reduces the flag; the fused kernel then sees unscaled
    gradients and the agreed flag."""
    from torch.amp.grad_scaler import OptState
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    if not isinstance(scaler, ShardedGradScaler):
        return
    state = scaler._per_optimizer_states[id(optimizer)]
    if state["stage"] is OptState.READY:  # not unscaled by clipping already
        scaler.unscale_(optimizer)
    # ShardedGradScaler's flags have shape [1], the fused kernels want a scalar (they subtract it from each
    # step count): "output with shape [] doesn't match the broadcast shape [1]" otherwise, clipping included.
    flags = state["found_inf_per_device"]
    for device, flag in flags.items():
        flags[device] = flag.reshape(())


def patch_optimizer_step(accelerated_optimizer: AcceleratedOptimizer, method):
    """`method` wrapped so that calling it records on `accelerated_optimizer` that a step ran
    (`_accelerate_step_called`); schedulers use the flag to tell a real step from one fp16 overflow skipped."""

    def patched_step(*args, **kwargs):
        accelerated_optimizer._accelerate_step_called = True
        return method(*args, **kwargs)

    return patched_step


def inner_optimizer(optimizer):
    """The torch optimizer inside hasten's `AcceleratedOptimizer` (or the optimizer itself, when given one)."""
    return getattr(optimizer, "optimizer", optimizer)


__all__ = ["AcceleratedOptimizer", "move_to_device", "patch_optimizer_step", "send_to_device"]
