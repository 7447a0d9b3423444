"""Token-normalised gradient accumulation (a hasten extension, opt-in: `GradientAccumulationPlugin(
normalize_by_tokens=True)` or `--gradient_accumulation_normalize_by_tokens`).

With variable-length sequences, averaging each micro-batch's mean loss over the accumulation steps and the
processes weights a micro-batch of 10 tokens as much as one of 1,000, so accumulating is not the large batch.
Here the gradient of a window is the gradient of the mean loss over every token of the window on every
data-parallel process, the same as one process computing the mean over all those tokens at once.

The loss hook: `accelerator.backward(loss, num_items_in_batch=n)`, where `loss` is the micro-batch's mean over its
`n` items (what a model returns by default, e.g. a causal LM's loss over its non-ignored labels). hasten
back-propagates `loss * n` (the micro-batch's sum; a model that returns the sum, `reduction="sum"`, passes
`loss_sum / n` or its own mean) without dividing by the accumulation steps, counts `n`, and at the last micro-step
of the window (when gradients synchronise, also the shorter last window of an epoch) all-reduces the window's
count and multiplies the gradients by (data-parallel size / count): DDP's and FSDP's averaging over processes
divided by the data-parallel size, this undoes it and divides by the count instead.

Costs: one all-reduce of one number per optimizer step, on the control plane.
"""

from __future__ import annotations

import torch

from ..core.errors import ConfigError


class TokenWindow:
    """The items counted so far in this accumulation window, on this process."""

    def __init__(self, data_parallel_size: int, backend):
        if backend.name not in ("single", "ddp", "fsdp", "tensor_parallel"):
            raise ConfigError(f"gradient accumulation normalize_by_tokens=True is not available with the {backend.name} "
                              "backend (its engine or schedule runs backward and scales the loss itself); fix: "
                              "DDP, FSDP or one process, or leave normalize_by_tokens off")
        layout = getattr(getattr(backend, "state", None), "parallelism_config", None)
        if layout is not None and layout.native_sp_enabled:
            # hasten's Ulysses: the sp ranks hold disjoint tokens (counted once each) and DDP/FSDP2 average over them
            # too, so the average to undo is over sp_size times as many ranks.
            data_parallel_size *= layout.sp_size
        self.data_parallel_size = data_parallel_size
        self.items = 0.0

    def backward(self, accelerator, loss, num_items_in_batch, kwargs) -> None:
        if num_items_in_batch is None:
            raise ConfigError("gradient accumulation normalize_by_tokens=True needs the number of items (tokens) "
                              "each micro-batch's mean loss is over: accelerator.backward(loss, num_items_in_batch=n)")
        items = float(num_items_in_batch.item() if isinstance(num_items_in_batch, torch.Tensor)
                      else num_items_in_batch)
        if items < 0:
            raise ConfigError(f"accelerator.backward num_items_in_batch={items:g} must be 0 or more")
        self.items += items
        total = loss * items if items else loss * 0.0  # a micro-batch with no items adds no gradient
        if accelerator.scaler is not None:
            accelerator.scaler.scale(total).backward(**kwargs)
        elif accelerator._backend.plain_backward:
            total.backward(**kwargs)
        else:
            accelerator._backend.backward(total, accumulation_steps=1, scaler=None, **kwargs)
        if accelerator.gradient_state.sync_gradients:
            self.finish_window(accelerator)

    def finish_window(self, accelerator) -> None:
        from ..distributed.operations import reduce

        count = torch.tensor([self.items], dtype=torch.float64)
        if accelerator.use_distributed:
            count = reduce(count.to(accelerator.device), reduction="sum").cpu()
        self.items = 0.0
        count = count.item()
        if count == 0:
            return  # no items anywhere: every gradient is zero already
        factor = self.data_parallel_size / count
        with torch.no_grad():
            for model in accelerator._models:
                for param in model.parameters():
                    if param.grad is not None:
                        param.grad.mul_(factor)


__all__ = ["TokenWindow"]
