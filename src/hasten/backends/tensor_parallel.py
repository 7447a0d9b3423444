"""Tensor (and context) parallelism on the layout's mesh, composed with FSDP2 over its data dimensions.

Order, as torch's composable APIs want it: split each planned layer over the `tp` dimension
(`hasten.distributed.tp_plan.apply_tensor_parallel`: parameters become DTensors), then, when the layout has
data-parallel dimensions, `fully_shard` over them (the FSDP backend's own code, on `parallelism_config.fsdp_mesh`):
`dp_shard` gives FSDP×TP, `dp_replicate` gives replicas of the TP model (HSDP with one shard), both give HSDP×TP.

Everything after preparing is the FSDP backend's: the user's optimizer is re-pointed at the new parameters,
checkpoints go through torch.distributed.checkpoint (the same `pytorch_model_fsdp_<i>/` folders, so a TP checkpoint
loads under FSDP or in one process, resharded), and `save_model` gathers whole weights.
"""

from __future__ import annotations

import torch

from ..core.errors import ConfigError
from .fsdp.backend import FSDPBackend, plain_named_parameters


class LayoutBackend(FSDPBackend):
    """FSDP2 over the data dimensions of the run's `ParallelismConfig` layout: the base of the backends that split
    a model along the layout's other dimensions (tensor parallel here, pipeline stages in `pipeline.py`)."""

    supports_clip_grad_value = False
    accelerate_fsdp2_step = False  # the layout shards in its own order (split first, then fully_shard)

    def __init__(self, state, plan, precision=None, ddp_kwargs=None):
        super().__init__(state, plan, precision=precision, ddp_kwargs=ddp_kwargs)
        self.layout = plan.parallelism_config


class TensorParallelBackend(LayoutBackend):
    name = "tensor_parallel"

    @property
    def regional_compilation_in_place(self) -> bool:
        return self._device_mesh() is not None  # FSDP2 over the data dimensions, as Accelerate

    clip_value_foreach = False  # torch's foreach clamp refuses split (DTensor) and whole gradients together

    @property
    def supports_clip_grad_value(self) -> bool:
        # Without FSDP2 (tensor parallel alone) Accelerate clips by value; an element-wise clamp of each DTensor
        # gradient's local pieces is the clamp of the whole gradient. With FSDP2 composed it refuses, as for FSDP.
        return self._device_mesh() is None

    def _device_mesh(self):
        """The mesh FSDP2 shards over (None without data-parallel dimensions)."""
        from ..parallelism_config import fsdp_mesh

        return fsdp_mesh(self.layout)

    def _shard(self, model: torch.nn.Module) -> torch.nn.Module:
        from ..distributed.tp_plan import apply_tensor_parallel, model_has_dtensor

        originals = plain_named_parameters(model)  # by state-dict name: activation checkpointing may wrap blocks
        model.to(self.state.device)
        if any(p.is_meta for p in originals.values()):
            raise ConfigError("prepare() got a model with parameters on the meta device; tensor parallelism needs its "
                              "weights: load them first")
        if self.layout.tp_enabled and not model_has_dtensor(model):  # a model split already (transformers) stays
            handler = self.layout.tp_handler
            apply_tensor_parallel(model, self.layout.submesh("tp"), getattr(handler, "tp_plan", None))
        if self._device_mesh() is not None:
            super()._shard(model)  # FSDP2 over the data dimensions (and its activation checkpointing); appends to _roots
        else:
            if self.plugin.activation_checkpointing:
                from .fsdp.backend import _apply_activation_checkpointing

                if self.plugin.activation_checkpointing_offload:
                    raise ConfigError("fsdp activation_checkpointing_offload is built for FSDP2 sharding, and this "
                                      "layout shards no data dimension; set it to false")

                _apply_activation_checkpointing(model, self.plugin.wrap_predicate(model), composable=True)
            self._roots.append(model)
        current = plain_named_parameters(model)
        for name, old in originals.items():
            new = current.get(name)
            if new is not None and new is not old:
                self._replacement[old] = new
                old.data = torch.empty(0, dtype=old.dtype, device=old.device)  # the user's optimizer still holds it
        return model

    def clip_grad_norm_(self, parameters, max_norm, norm_type=2.0):
        """Clip by the norm over every rank's pieces; DTensor gradients on different meshes (split layers, FSDP's
        shards, whole layers) are normed per mesh, then combined."""
        from ..distributed.grad_norm import clip_grad_norm_sharded_

        return clip_grad_norm_sharded_(parameters, float(max_norm), float(norm_type))
