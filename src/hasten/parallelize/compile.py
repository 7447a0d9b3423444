"""Step: torch.compile, last, around what the backend returns (Accelerate's order: the compiled module wraps the
distributed one). The plan's `TorchDynamoPlugin` decides; `training/compilation.compile_model` compiles the whole
model or, with `use_regional_compilation`, its repeated blocks: in place where the backend's hooks must stay on the
call path (FSDP2, DeepSpeed, pipeline stages), as a new tree elsewhere."""

from __future__ import annotations


def apply_compile(model, dynamo_plugin, regions_in_place: bool):
    """`model` compiled as the plugin says, or `model` itself (no plugin, backend "no"; a model compiled already is
    returned by `compile_model` as it is)."""
    from ..core.enums import DynamoBackend

    if dynamo_plugin is None or dynamo_plugin.backend == DynamoBackend.NO:
        return model
    from ..training.compilation import compile_model

    return compile_model(model, dynamo_plugin, regions_in_place=regions_in_place)
