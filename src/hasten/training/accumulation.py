"""The `accumulate()` context of `Accelerator`: each micro-step decides whether it synchronises gradients, and
holds back the gradient sync of the models it was given on the others."""

from __future__ import annotations


class AccumulationStep:
    """The `accumulate()` context. A plain class, not a generator: it runs on every training step."""

    __slots__ = ("accelerator", "models", "entered")

    def __init__(self, accelerator, models):
        self.accelerator = accelerator
        self.models = models
        self.entered = ()

    def __enter__(self):
        accelerator = self.accelerator
        accelerator._do_sync()
        # Only several processes have a gradient sync to hold back (no_sync is a no-op in one).
        if not accelerator._holds_back_sync or not self.models:
            return None
        state = accelerator.gradient_state
        if state.sync_gradients or state.sync_each_batch:
            return None
        self.entered = [accelerator.no_sync(model) for model in self.models]
        for context in self.entered:
            context.__enter__()
        return None

    def __exit__(self, *exc_info):
        if self.entered:
            for context in reversed(self.entered):
                context.__exit__(*exc_info)
            self.entered = ()
        preemption = self.accelerator._preemption
        if preemption is not None and exc_info[0] is None and self.accelerator.gradient_state.sync_gradients:
            preemption.at_step_boundary()  # the step is complete: every rank agrees whether to checkpoint and stop
        return False


__all__ = ["AccumulationStep"]
