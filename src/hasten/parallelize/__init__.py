"""Laying a model out over the run's mesh: ordered, independent steps, one module each, chosen from the run plan's
layout (`plan.parallelism_config`), FSDP settings (`plan.sharding_plugin`) and dynamo plugin, as torchtitan's
`parallelize_*` functions do. In the order a model meets them in `Accelerator.prepare_model`:

1. `sequence.apply_sp`: hasten's Ulysses sequence parallelism (sp_size > 1, `sp_backend="hasten"`) on the model as
   the script built it (`Backend.layout_model`); its loaders are sharded by `sequence.shard_loader`;
2. `parallelize(model, plan)` below, inside the backend's `prepare_model`:
   a. `pipeline.split_stages`: cut the model into stages over `pp`, keep this process's (pp_size > 1);
   b. `tensor.apply_tp`: split the planned layers over `tp` (tp_size > 1);
   c. `checkpointing`: activation checkpointing (the plugin's `activation_checkpointing`);
   d. `fsdp`: FSDP2 over the data-parallel dimensions (`parallelism_config.fsdp_mesh`: dp_shard, dp_replicate, and
      cp, which shards parameters like dp_shard and splits attention at run time in `maybe_context_parallel`);
3. `compile.apply_compile`: torch.compile, last, around what the backend returned (`Backend.compile_model`;
   Accelerate's order).

Replicas without a layout are `replicate.apply_ddp` (the ddp backend); a plain FSDP run is step 2d alone
(`fsdp.apply_fsdp`, the fsdp backend). Each step is a function of the model and the plan's settings; the backends
call them, and the facade calls only the backend. What a backend keeps about the result (the parameters an optimizer
must be re-pointed at, the roots its checkpoints read) stays in the backend.
"""

from __future__ import annotations

from ..core.errors import ConfigError
from .pipeline import Stages


def parallelize(model, plan, *, device, shard=None) -> Stages | None:
    """Apply the layout steps of `plan` to `model`, in place, in the order above. `shard(module)` is step 4 for a
    layout without pipeline stages (the backend's `fsdp.apply_fsdp`, which also decides CPU offload); a pipeline's
    stages are sharded here (`fsdp.shard_stages`). Returns this process's `Stages` of a pipeline, else None."""
    from ..parallelism_config import fsdp_mesh
    from . import checkpointing, fsdp
    from .pipeline import split_stages
    from .tensor import apply_tp

    layout, plugin = plan.parallelism_config, plan.sharding_plugin
    stages = split_stages(model, layout, device) if layout.pp_enabled else None
    target = stages.view if stages is not None else model
    if layout.tp_enabled:
        apply_tp(target, layout)
    dp_mesh = fsdp_mesh(layout)
    if stages is not None:
        if plugin.activation_checkpointing:
            checkpointing.checkpoint_blocks([b for b in stages.blocks if any(True for _ in b.parameters())])
        if dp_mesh is not None:
            fsdp.shard_stages(stages.blocks, stages.chunks, plugin, dp_mesh)
        return stages
    if dp_mesh is not None:
        shard(model)  # activation checkpointing (CheckpointWrapper), then fully_shard: Accelerate's FSDP2 order
    elif plugin.activation_checkpointing:
        if plugin.activation_checkpointing_offload:
            raise ConfigError("fsdp activation_checkpointing_offload is built for FSDP2 sharding, and this layout "
                              "shards no data dimension; set it to false")
        checkpointing.checkpoint_blocks(checkpointing.blocks_of(model, plugin.wrap_predicate(model)))
    return None


__all__ = ["Stages", "parallelize"]
