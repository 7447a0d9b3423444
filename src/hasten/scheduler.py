"""`AcceleratedScheduler`: a learning-rate scheduler that follows the optimizer's real steps."""

from __future__ import annotations

import warnings

from .state import AcceleratorState, GradientState



def _first_step_quietly(scheduler, *args, **kwargs):
    """The scheduler's first real step, without torch's "lr_scheduler.step() before optimizer.step()" warning:
    with gated steps (or a step the scaler skipped) the optimizer's step counter looks behind, though it is
    not. Silenced for this call only, never process-wide."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step", category=UserWarning)
        scheduler.step(*args, **kwargs)


class AcceleratedScheduler:
    """Steps the wrapped scheduler only when the optimizer really stepped.

    Without `split_batches`, one call steps the scheduler `num_processes` times: each process consumed
    one batch, so together they used `num_processes` batches' worth of a single-process schedule.
    """

    def __init__(self, scheduler, optimizers, step_with_optimizer: bool = True, split_batches: bool = False):
        self.scheduler = scheduler
        self.optimizers = optimizers if isinstance(optimizers, (list, tuple)) else [optimizers]
        self.split_batches = split_batches
        self.step_with_optimizer = step_with_optimizer
        self.gradient_state = GradientState()
        self._num_processes = None  # read once, on the first real step (the state exists by then)

    def step(self, *args, **kwargs):
        gradient_state = self.gradient_state
        if not gradient_state.sync_gradients and self.step_with_optimizer:  # an accumulation micro-step
            if gradient_state.adjust_scheduler:
                self.scheduler._step_count += 1
            return
        if not self.step_with_optimizer:
            self._step_once(*args, **kwargs)
            return
        for optimizer in self.optimizers:  # a plain loop: this runs on every optimizer step
            if getattr(optimizer, "step_was_skipped", False):
                return
        if self.split_batches:
            self._step_once(*args, **kwargs)
            return
        if self._num_processes is None:
            from .data.ranks import data_parallel_size

            # Processes of one tensor/context-parallel group read the same batch: count the different ones.
            self._num_processes = data_parallel_size(AcceleratorState())
        total_steps = getattr(self.scheduler, "total_steps", None)
        if self._num_processes == 1 and total_steps is None:
            self._step_once(*args, **kwargs)
            return
        for _ in range(self._num_processes):
            if total_steps is not None and self.scheduler._step_count > total_steps:
                break
            self._step_once(*args, **kwargs)

    def _step_once(self, *args, **kwargs):
        if getattr(self.scheduler, "_step_count", 2) <= 1:
            _first_step_quietly(self.scheduler, *args, **kwargs)
        else:
            self.scheduler.step(*args, **kwargs)

    def get_last_lr(self):
        return self.scheduler.get_last_lr()

    def state_dict(self):
        return self.scheduler.state_dict()

    def load_state_dict(self, state_dict):
        self.scheduler.load_state_dict(state_dict)

    def get_lr(self):
        return self.scheduler.get_lr()

    def print_lr(self, *args, **kwargs):
        return self.scheduler.print_lr(*args, **kwargs)

    def __getattr__(self, name):
        # Anything else (e.g. `last_epoch`, `base_lrs`) reads through to the wrapped scheduler.
        if name == "scheduler":
            raise AttributeError(name)
        return getattr(self.scheduler, name)
