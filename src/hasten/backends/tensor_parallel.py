"""Tensor (and context) parallelism on the layout's mesh, composed with FSDP2 over its data dimensions.

The model is laid out by `hasten.parallelize.parallelize(model, plan)`: the planned layers split over the `tp`
dimension (parameters become DTensors), then, when the layout has data-parallel dimensions, FSDP2 over them
(`parallelism_config.fsdp_mesh`: `dp_shard` gives FSDP×TP, `dp_replicate` gives replicas of the TP model, HSDP with one
shard; both give HSDP×TP), else activation checkpointing in place.

What the backend keeps about the result is the sharded models' helper (`backends/sharded.py`), which the FSDP backend
holds too: the user's optimizer is re-pointed at the new parameters, checkpoints go through
torch.distributed.checkpoint (the same `pytorch_model_fsdp_<i>/` folders, so a TP checkpoint loads under FSDP or in
one process, resharded), and `save_model` gathers whole weights.
"""

from __future__ import annotations

import torch

from ..core.errors import ConfigError
from ..optimizer import inner_optimizer
from ..parallelize import parallelize
from ..parallelize.fsdp import plain_named_parameters
from .base import Backend
from .sharded import ShardedModels, delegate_to_sharded


@delegate_to_sharded
class TensorParallelBackend(Backend):
    name = "tensor_parallel"
    accelerate_fsdp2_step = False  # the layout shards in its own order (split first, then fully_shard)
    clip_value_foreach = False  # torch's foreach clamp refuses split (DTensor) and whole gradients together

    def __init__(self, state, plan, precision=None, ddp_kwargs=None):
        super().__init__(state, plan, precision=precision, ddp_kwargs=ddp_kwargs)
        self.layout = plan.parallelism_config
        self.version = self.plugin.fsdp_version  # FSDP2 (the plan refuses a layout with FSDP1)
        self.sharded = ShardedModels(self.plugin, state.device)  # prepared models, replaced parameters, checkpoints
        self._fsdp2_steps = (None, None)

    @property
    def regional_compilation_in_place(self) -> bool:
        return self._device_mesh() is not None  # FSDP2 over the data dimensions, as Accelerate

    @property
    def supports_clip_grad_value(self) -> bool:
        # Without FSDP2 (tensor parallel alone) Accelerate clips by value; an element-wise clamp of each DTensor
        # gradient's local pieces is the clamp of the whole gradient. With FSDP2 composed it refuses, as for FSDP.
        return self._device_mesh() is None

    def _device_mesh(self):
        """The mesh FSDP2 shards over (None without data-parallel dimensions)."""
        from ..parallelism_config import fsdp_mesh

        return fsdp_mesh(self.layout)

    # -- preparing ------------------------------------------------------------------------------------------
    def prepare_together(self, models, optimizers, **_):
        """Lay out every model of this `prepare` call, then point the optimizers at the new parameters."""
        self.sharded.lay_out_all(models, self._shard)
        for optimizer in optimizers:
            self.sharded.repoint(inner_optimizer(optimizer))

    def prepare_model(self, model, device_placement, evaluation_mode):
        return self.sharded.lay_out(model, self._shard)

    def prepare_fsdp2_model(self, model, wrap_policy=None, upcast=None):
        """`prepare_model` for Accelerate's `fsdp2_prepare_model` (see the FSDP backend's): its wrap policy and upcast
        reach the FSDP2 step over the data dimensions."""
        self._fsdp2_steps = (wrap_policy, upcast)
        try:
            return self.prepare_model(model, device_placement=True, evaluation_mode=False)
        finally:
            self._fsdp2_steps = (None, None)

    def _shard(self, model: torch.nn.Module) -> torch.nn.Module:
        originals = plain_named_parameters(model)  # by state-dict name: activation checkpointing may wrap blocks
        model.to(self.state.device)
        if any(p.is_meta for p in originals.values()):
            raise ConfigError("prepare() got a model with parameters on the meta device; tensor parallelism needs its "
                              "weights: load them first")
        mesh = self._device_mesh()

        def shard(module):
            self.sharded.shard_fsdp2(module, mesh, self.precision.mode, self._fsdp2_steps)

        parallelize(model, self.plan, device=self.state.device, shard=shard)
        if mesh is None:
            self.sharded.roots.append(model)
        current = plain_named_parameters(model)
        for name, old in originals.items():
            new = current.get(name)
            if new is not None and new is not old:
                self.sharded.replacement[old] = new
                old.data = torch.empty(0, dtype=old.dtype, device=old.device)  # the user's optimizer still holds it
        return model

    # -- the training step (owner_of, no_sync and the checkpoints: sharded.delegate_to_sharded) ------------
    def clip_grad_norm_(self, parameters, max_norm, norm_type=2.0):
        """Clip by the norm over every rank's pieces; DTensor gradients on different meshes (split layers, FSDP's
        shards, whole layers) are normed per mesh, then combined."""
        from ..distributed.grad_norm import clip_grad_norm_sharded_

        return clip_grad_norm_sharded_(parameters, float(max_norm), float(norm_type))
