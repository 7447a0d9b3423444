"""What `prepare` hands back under DeepSpeed: the engine owns backward, the optimizer step, clipping and the
DeepSpeed scheduler, so the optimizer and scheduler wrappers only keep Accelerate's surface."""

from __future__ import annotations

from ...optimizer import AcceleratedOptimizer
from ...scheduler import AcceleratedScheduler


class DeepSpeedEngineWrapper:
    """One DeepSpeed engine: `backward` marks the accumulation boundary, runs the engine's backward (which
    divides the loss by the accumulation steps itself) and, on the last micro-step, the engine's step
    (clip, optimizer step, zero_grad, DeepSpeed scheduler step)."""

    def __init__(self, engine):
        self.engine = engine

    def backward(self, loss, sync_gradients: bool = True, **kwargs):
        self.engine.set_gradient_accumulation_boundary(is_boundary=sync_gradients)
        self.engine.backward(loss, **kwargs)
        if sync_gradients:
            self.engine.step()

    def get_global_grad_norm(self):
        norm = self.engine.get_global_grad_norm()
        return norm.item() if hasattr(norm, "item") else norm


class DeepSpeedOptimizerWrapper(AcceleratedOptimizer):
    """The engine's optimizer. The engine stepped and zeroed in `backward`: `step` only counts the step for
    preemption handling (as the plain optimizer's does), `zero_grad` does nothing."""

    def __init__(self, optimizer):
        super().__init__(optimizer, device_placement=False, scaler=None)
        self.__has_overflow__ = hasattr(self.optimizer, "overflow")

    def zero_grad(self, set_to_none=None):
        pass

    def step(self, closure=None):
        from ...resilience import preemption

        if self.gradient_state.sync_gradients and preemption._active is not None:
            preemption._active.count_optimizer_step()

    @property
    def step_was_skipped(self) -> bool:
        """True when DeepSpeed skipped the last step because fp16 gradients overflowed."""
        return bool(self.optimizer.overflow) if self.__has_overflow__ else False

    def __repr__(self):
        return f"DeepSpeedOptimizerWrapper({self.optimizer!r})"


class DeepSpeedSchedulerWrapper(AcceleratedScheduler):
    """A scheduler DeepSpeed steps inside `engine.step()`; `step` here does nothing."""

    def step(self, *args, **kwargs):
        pass
