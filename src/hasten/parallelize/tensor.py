"""Layout step: tensor parallelism. Each planned layer is split over the layout's `tp` dimension (its parameters become
DTensors), by the plan `distributed/tp_plan.py` resolves (the handler's `tp_plan`, the model's own, else the
automatic one)."""

from __future__ import annotations


def apply_tp(model, layout) -> None:
    """Split `model`'s planned layers over `layout.submesh("tp")`, in place. A model split already (transformers'
    `tp_plan` loading) stays as it is."""
    from ..distributed.tp_plan import apply_tensor_parallel, model_has_dtensor

    if model_has_dtensor(model):
        return
    apply_tensor_parallel(model, layout.submesh("tp"), getattr(layout.tp_handler, "tp_plan", None))
