"""LOMO / AdaLomo (the `lomo-optim` package): optimizers that update each parameter inside backward.

`accelerator.backward(loss, learning_rate=lr)` with such an optimizer prepared runs its `fused_backward`, as
Accelerate does. The class is recognised by its module, so nothing is imported when lomo-optim is absent.
"""

from __future__ import annotations

from ..optimizer import inner_optimizer


def is_lomo_optimizer(optimizer) -> bool:
    """Whether `optimizer` (or the optimizer a wrapper holds) is lomo_optim's Lomo or AdaLomo."""
    cls = type(inner_optimizer(optimizer))
    return cls.__module__.split(".")[0] == "lomo_optim" and cls.__name__ in ("Lomo", "AdaLomo")


def lomo_backward(optimizers, loss, learning_rate) -> None:
    """Backward through each prepared LOMO optimizer's `fused_backward` (it updates the parameters as it goes)."""
    ran = False
    for optimizer in optimizers:
        if is_lomo_optimizer(optimizer):
            inner_optimizer(optimizer).fused_backward(loss, learning_rate)
            ran = True
    if not ran:
        raise ValueError("Backward pass not properly called on LOMO optimizers: none of the prepared optimizers is "
                         "a Lomo or AdaLomo; fix: pass it to accelerator.prepare()")
