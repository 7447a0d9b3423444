"""Pipeline parallelism on the layout's mesh, composed with tensor parallelism and FSDP2 (or replicas).

The model is laid out by `hasten.parallelize.parallelize(model, plan)`, in torchtitan's order: cut into stages over the
`pp` dimension, keep this process's stages only, split their layers over `tp`, then `fully_shard` each block and each
stage over the data-parallel dimensions (`parallelism_config.fsdp_mesh`: `dp_shard` shards, `dp_replicate` alone
replicates with one shard). The stage is the FSDP root, so the schedule's own hooks
(`PipelineStage.backward_maybe_with_nosync` / `perform_reduce_grad`) hold back the reduce-scatter to the last
micro-batch of each run.

The prepared model is a `PipelinedModel`: calling it in training mode runs the schedule and returns the loss;
`accelerator.backward` has nothing left to do. The optimizer keeps only this process's parameters.

Checkpoints: torch.distributed.checkpoint, in the FSDP backend's folders (`pytorch_model_fsdp_<i>/`,
`optimizer_<i>/`), keyed by the whole model's parameter names, so a pp=2 checkpoint loads into one process (under
an FSDP2 plugin) or into another pipeline layout, resharded. The optimizer state is saved flattened (one key per
parameter), since each stage holds the param groups of its own parameters only.
"""

from __future__ import annotations

import contextlib
import os

import torch
import torch.distributed as dist

from ..core.errors import CheckpointError, ConfigError, PipelineCallError
from ..optimizer import inner_optimizer as _plain
from ..parallelize import parallelize
from .base import Backend, refuse_load_kwargs
from .fsdp import checkpoint as fsdp_checkpoint
from .sharded import ShardedModels, delegate_to_sharded


@delegate_to_sharded  # owner_of; its own sync and checkpoint methods are kept
class PipelineBackend(Backend):
    name = "pipeline"
    supports_clip_grad_value = False
    accelerate_fsdp2_step = False  # the layout shards in its own order (stages first, then fully_shard)
    regional_compilation_in_place = True  # FSDP2's hooks (and the stages' modules) must stay on the call path

    def __init__(self, state, plan, precision=None, ddp_kwargs=None):
        super().__init__(state, plan, precision=precision, ddp_kwargs=ddp_kwargs)
        self.layout = plan.parallelism_config
        self.version = self.plugin.fsdp_version  # FSDP2 (the plan refuses a layout with FSDP1)
        self.sharded = ShardedModels(self.plugin, state.device)  # prepared models, replaced parameters, roots
        if self.precision.uses_grad_scaler:
            raise ConfigError("mixed_precision='fp16' scales the loss before backward, but with pp_size > 1 the "
                              "pipeline schedule runs backward itself; fix: mixed_precision='bf16' (or 'no')")
        if not fsdp_checkpoint.is_sharded(self.plugin):
            raise ConfigError("fsdp state_dict_type=FULL_STATE_DICT is not available with pipeline parallelism (each "
                              "stage holds different weights; save_state writes sharded DCP folders); fix: "
                              "SHARDED_STATE_DICT (save_model still writes whole weights)")
        self._dropped: set = set()  # ids of parameters of the other stages (the user's optimizer still holds them)

    # -- preparing ------------------------------------------------------------------------------------------
    def prepare_together(self, models, optimizers, **_):
        self.sharded.lay_out_all(models, self._pipeline)
        for optimizer in optimizers:
            self._keep_own_parameters(_plain(optimizer))

    def prepare_model(self, model, device_placement, evaluation_mode):
        return self.sharded.lay_out(model, self._pipeline)

    def _pipeline(self, model):
        from ..distributed.pipeline import PipelinedModel
        from ..state import GradientState

        layout, handler = self.layout, self.layout.pp_handler
        mesh = layout.device_mesh
        originals = dict(model.named_parameters())
        stages = parallelize(model, self.plan, device=self.state.device)
        self._dropped |= stages.dropped  # the user's optimizer still holds them: dropped there (prepare_together)
        for chunk in stages.chunks:
            self.precision.wrap_forward(chunk)
        current = dict(stages.view.named_parameters())
        for name, old in originals.items():
            if name in current and current[name] is not old:
                self.sharded.replacement[old] = current[name]
                old.data = torch.empty(0, dtype=old.dtype, device=old.device)
        microbatches = handler.microbatches or stages.num_stages
        wrapped = PipelinedModel(
            stages.view, stages.chunks, stages.mine, stages.num_stages, mesh.get_group("pp"), mesh.get_local_rank("pp"),
            layout.pp_size, handler.schedule, microbatches, handler.loss_fn, self.state.device,
            lambda: GradientState().num_steps)
        self.sharded.roots.append(wrapped)
        return wrapped

    def _keep_own_parameters(self, optimizer) -> None:
        """Point the user's optimizer at this process's (split, sharded) parameters and drop the other stages'."""
        for group in optimizer.param_groups:
            params = group["params"]
            if any(p in optimizer.state and optimizer.state[p] for p in params):
                raise ConfigError(f"{type(optimizer).__name__} already has state (it stepped before prepare); with "
                                  "pipeline parallelism create or reset the optimizer before calling prepare()")
            group["params"] = [self.sharded.replacement.get(p, p) for p in params if id(p) not in self._dropped]

    # -- the training step ----------------------------------------------------------------------------------
    def backward(self, loss, accumulation_steps=1, scaler=None, **kwargs):
        """Nothing: the schedule ran backward when the model was called (as Accelerate's Megatron-LM path)."""
        if isinstance(loss, torch.Tensor) and loss.requires_grad:
            raise PipelineCallError("accelerator.backward got a loss with a graph, but with pipeline parallelism the "
                                    "loss comes from calling the prepared model in training mode (which already ran "
                                    "backward); fix: loss = model(inputs, labels=labels)")

    def no_sync(self, model):
        return contextlib.nullcontext()  # each schedule run reduces once, after its last micro-batch

    def trigger_sync_in_backward(self, model):
        return contextlib.nullcontext()

    def check_save_kwargs(self, save_model_func_kwargs):
        # no_sync changes nothing here, so a window's partial sum is in `.grad`, which save_state keeps.
        super().check_save_kwargs(save_model_func_kwargs)

    def clip_grad_norm_(self, parameters, max_norm, norm_type=2.0):
        """Clip by the norm over every stage's gradients (each process's pieces, combined over the mesh)."""
        from torch.distributed.tensor import DTensor

        norm_type = float(norm_type)
        params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        grads = [p.grad for p in params if p.grad is not None]
        groups: dict = {}
        for grad in grads:
            groups.setdefault(grad.device_mesh if isinstance(grad, DTensor) else None, []).append(grad)
        inf = norm_type == float("inf")
        local = torch.zeros((), dtype=torch.float32, device=self.state.device)
        for group in groups.values():
            norm = torch.nn.utils.get_total_norm(group, norm_type)
            norm = (norm.full_tensor() if isinstance(norm, DTensor) else norm).float()
            local = torch.maximum(local, norm) if inf else local + norm ** norm_type
        group = self.layout.device_mesh.get_group("pp")
        dist.all_reduce(local, op=dist.ReduceOp.MAX if inf else dist.ReduceOp.SUM, group=group)
        total = local if inf else local ** (1.0 / norm_type)
        coefficient = min(1.0, float(max_norm) / (total.item() + 1e-6))
        if coefficient < 1.0:
            for grad in grads:
                grad.mul_(coefficient)
        return total

    # -- checkpoints ----------------------------------------------------------------------------------------
    def full_state_dict(self, model, unwrap=True):
        """The whole model on the main process (`{}` elsewhere): each stage's weights gathered over its data and
        tensor dimensions, then sent to rank 0 by one process of each stage."""
        from torch.distributed.tensor import DTensor

        local = {}
        for key, value in model.state_dict().items():
            local[key] = (value.full_tensor() if isinstance(value, DTensor) else value).detach().cpu()
        mesh = self.layout.device_mesh
        sender = all(mesh.get_local_rank(name) == 0 for name in mesh.mesh_dim_names if name != "pp")
        parts = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
        dist.gather_object(local if sender else {}, parts, dst=0)
        if dist.get_rank() != 0:
            return {}
        merged = {}
        for part in parts:
            merged.update(part)
        return merged

    def save_model_and_optimizer(self, folder, models, optimizers, *, writer=True, rank=0, safe_serialization=True,
                                 before_write=None, **save_model_func_kwargs) -> list:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

        from ..checkpoint.storage import dcp as layer_dcp

        if before_write is not None:
            before_write([])
        written = []
        for index, model in enumerate(models):
            name = fsdp_checkpoint.sharded_name(fsdp_checkpoint.MODEL_NAME, index)
            layer_dcp.save({"model": get_model_state_dict(model)}, os.path.join(folder, name))
            written.append(name)
        for index, optimizer in enumerate(optimizers):
            name = fsdp_checkpoint.sharded_name(fsdp_checkpoint.OPTIMIZER_NAME, index)
            state = get_optimizer_state_dict(self.owner_of(optimizer), _plain(optimizer), options=_flat())
            layer_dcp.save({"optimizer": state}, os.path.join(folder, name))
            written.append(name)
        return written

    def stage_model_and_optimizer(self, *args, **kwargs):
        from ..checkpoint.async_save import refuse

        raise refuse(self)

    def load_model_and_optimizer(self, folder, models, optimizers, *, map_location="cpu", load_kwargs=None,
                                 strict=True, **load_model_func_kwargs) -> None:
        refuse_load_kwargs(self, load_model_func_kwargs, accepted=())
        for index, model in enumerate(models):
            # DCP reads just this process's keys and pieces
            fsdp_checkpoint.load_model(model, folder, index, strict=strict)
        for index, optimizer in enumerate(optimizers):
            path = os.path.join(folder, fsdp_checkpoint.sharded_name(fsdp_checkpoint.OPTIMIZER_NAME, index))
            if not fsdp_checkpoint._is_dcp_dir(path):
                raise CheckpointError(f"{folder} has no sharded optimizer state {os.path.basename(path)}/ (a pipelined "
                                      "run loads sharded DCP checkpoints: save with SHARDED_STATE_DICT)")
            fsdp_checkpoint.load_optimizer_flat_or_not(self.owner_of(optimizer), _plain(optimizer), path,
                                                      one_stage=True)


def _flat():
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(flatten_optimizer_state_dict=True)
