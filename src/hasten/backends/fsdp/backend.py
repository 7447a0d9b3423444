"""Sharded data parallel with PyTorch FSDP: each process keeps only its shard of parameters, gradients and
optimizer state, and gathers whole parameters just for the forward and backward of one block.

FSDP2 (`fully_shard`, the default for new code) changes modules in place and turns parameters into
DTensors, so optimizers built before `prepare` are re-pointed at the new parameters here (`prepare_together`).
FSDP1 (`FullyShardedDataParallel`) wraps the module in a container. Both run on CPU processes with gloo.

Checkpoints of sharded state go through torch.distributed.checkpoint (see `checkpoint.py` beside this module), so a run
saved by N processes loads into M.
"""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist

from ...core.errors import ConfigError
from ...distributed.bootstrap import init_single_process_group
from ...distributed.grad_norm import clip_grad_norm_sharded_
from ...optimizer import inner_optimizer
from ...parallelize import checkpointing
from ...parallelize import fsdp as sharding
from ...parallelize.fsdp import can_be_unit, ignored_modules
from ...parallelize.fsdp import ignored_modules as _ignored_modules  # noqa: F401 - published here too
from ...parallelize.fsdp import named_tensors as _named_tensors
from ..base import Backend
from ..sharded import ShardedModels, delegate_to_sharded
from ..sharded import _requires_gradient_sync  # noqa: F401 - published here too
from ..unwrap import is_fsdp1


@delegate_to_sharded
class FSDPBackend(Backend):
    name = "fsdp"
    supports_clip_grad_value = False  # a value clip on shards is fine, but Accelerate refuses it: keep one rule

    @property
    def regional_compilation_in_place(self) -> bool:
        return self.version == 2  # as Accelerate: FSDP2's hooks must stay on the call path; FSDP1 gets a new tree

    @property
    def accelerate_fsdp2_step(self) -> bool:
        """Whether `prepare` takes Accelerate's FSDP2 step (`Accelerator._prepare_fsdp2`, sharding each model
        through `fsdp2_prepare_model`) before `prepare_together`: plain FSDP2 (the layout backends, tensor and
        pipeline parallel, shard in their own order and say so themselves)."""
        return self.version == 2

    def __init__(self, state, plan, precision=None, ddp_kwargs=None):
        super().__init__(state, plan, precision=precision, ddp_kwargs=ddp_kwargs)
        self.version = self.plugin.fsdp_version
        self.sharded = ShardedModels(self.plugin, state.device)  # prepared models, replaced parameters, checkpoints
        self._mesh = None
        self._fsdp2_steps = (None, None)

    def make_grad_scaler(self):
        """fp16 loss scaling: FSDP1's local gradients need every process to agree on overflow (FSDP2's DTensor
        gradients already make torch's GradScaler agree)."""
        if self.version != 1 or not self.precision.uses_grad_scaler:
            return super().make_grad_scaler()
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(self.precision.device_type, **self.precision.scaler_kwargs)

    # -- preparing ------------------------------------------------------------------------------------------
    def prepare_together(self, models, optimizers, **_):
        """Shard every model of this `prepare` call, then point the optimizers at the sharded parameters."""
        self.sharded.lay_out_all(models, self._shard)
        for optimizer in optimizers:
            self.sharded.repoint(inner_optimizer(optimizer))

    def prepare_model(self, model, device_placement, evaluation_mode):
        return self.sharded.lay_out(model, self._shard)

    def _check_device(self):
        device = self.state.device
        strategy = getattr(self.plugin.sharding_strategy, "name", "")
        if self.version == 1 and device.type == "cpu" and strategy.lstrip("_").startswith("HYBRID_SHARD"):
            raise ConfigError(
                f"fsdp sharding_strategy {strategy} (FSDP1) silently diverges on CPU processes; for hybrid sharding "
                "use ParallelismConfig(dp_replicate_size=..., dp_shard_size=...) (FSDP2 HSDP)"
            )
        self.sharded.check_offload()

    @property
    def offloads_params(self) -> bool:
        """Whether the shards live in CPU memory between uses: the plugin's cpu_offload, but not on a CPU run."""
        return self.sharded.offloads_params

    def _device_mesh(self):
        if self._mesh is None:
            from torch.distributed.device_mesh import init_device_mesh

            if not dist.is_initialized():
                init_single_process_group()

            layout = self.plan.parallelism_config
            if layout is not None and layout.device_mesh is not None:  # the layout's FSDP view (2-D for HSDP)
                from ...parallelism_config import fsdp_mesh

                self._mesh = fsdp_mesh(layout)
            else:
                self._mesh = init_device_mesh(self.state.device.type, (dist.get_world_size(),))
        return self._mesh

    def _shard(self, model: torch.nn.Module) -> torch.nn.Module:
        if not any(True for _ in model.parameters()):
            return model.to(self.state.device)
        self._check_device()
        mesh = self._device_mesh()  # also makes a one-process group when the script was not launched
        if self.version == 2:
            # The steps Accelerate's fsdp2_prepare_model takes (parallelize/fsdp.py); the policy and the upcast are
            # the ones its `utils.fsdp_utils` handed in (prepare_fsdp2_model), so a script's mock.patch reaches the run.
            return self.sharded.shard_fsdp2(model, mesh, self.precision.mode, self._fsdp2_steps)
        sharding.refuse_meta(model, self.plugin, fsdp2=False)
        sharded = self._shard_fsdp1(model)
        self.sharded.roots.append(sharded)
        return sharded

    def prepare_fsdp2_model(self, model, wrap_policy=None, upcast=None):
        """`prepare_model` for Accelerate's `fsdp2_prepare_model`, which hands in its own (patchable) wrap policy
        `(plugin, model) -> predicate or None` and upcast `(model, mixed_precision, is_main_process)`."""
        self._fsdp2_steps = (wrap_policy, upcast)
        try:
            return self.prepare_model(model, device_placement=True, evaluation_mode=False)
        finally:
            self._fsdp2_steps = (None, None)

    def _shard_fsdp1(self, model):
        from torch.distributed.fsdp import FullyShardedDataParallel
        from torch.distributed.fsdp.wrap import lambda_auto_wrap_policy

        plugin = self.plugin
        device = self.state.device
        on_meta = _on_any_rank(any(p.is_meta for p in model.parameters()))
        if on_meta and plugin.param_init_fn is not None:
            pass  # FSDP1 calls the user's param_init_fn on each meta module it wraps: that materialises the model
        elif on_meta:
            # FSDP1 materialises meta modules through sync_module_states, which fails on CPU processes.
            if device.type == "cpu":
                raise ConfigError(
                    "fsdp cpu_ram_efficient_loading with fsdp_version=1 cannot fill models built on the meta device on "
                    "CPU processes (FSDP1's sync_module_states needs an accelerator); use fsdp_version=2"
                )
            raise ConfigError(
                "FSDP1 in hasten does not load models built on the meta device yet; use fsdp_version=2 with "
                "cpu_ram_efficient_loading=True"
            )
        if not on_meta:
            model = model.to(device)
        if plugin.sync_module_states:
            # FSDP1's own sync_module_states fails on CPU processes; broadcasting before wrapping is the same.
            with torch.no_grad():
                for tensor in _named_tensors(model).values():
                    dist.broadcast(tensor, src=0)
        policy = plugin.auto_wrap_policy
        if policy is not None and not callable(policy):
            predicate = plugin.wrap_predicate(model)
            if predicate is not None:
                policy = functools.partial(lambda_auto_wrap_policy,
                                           lambda_fn=lambda module: can_be_unit(module) and predicate(module))
            else:
                policy = None
        if plugin.activation_checkpointing:
            checkpointing.wrap_blocks_for_fsdp1(model, plugin.wrap_predicate(model))
        ignored = ignored_modules(model, plugin.ignored_modules) or None
        old_params = list(model.parameters())
        wrapped = FullyShardedDataParallel(
            model,
            sharding_strategy=plugin.sharding_strategy,
            cpu_offload=self.sharded.offload_setting(),
            auto_wrap_policy=policy,
            mixed_precision=plugin.mixed_precision_policy,
            backward_prefetch=plugin.backward_prefetch,
            forward_prefetch=bool(plugin.forward_prefetch),
            limit_all_gathers=plugin.limit_all_gathers,
            use_orig_params=bool(plugin.use_orig_params),
            ignored_modules=ignored,
            param_init_fn=plugin.param_init_fn,
            device_id=device,
        )
        if not plugin.use_orig_params:
            # The user's parameters now live inside flat parameters; remember which optimizer lists to rebuild.
            flat = list(wrapped.parameters())
            for old in old_params:
                self.sharded.replacement[old] = flat
        return wrapped

    # -- the training step (owner_of, no_sync and the checkpoints: sharded.delegate_to_sharded) ------------
    def clip_grad_norm_(self, parameters, max_norm, norm_type=2.0):
        """Clip by the norm over all shards on all processes; returns that global norm (the same on every rank)."""
        params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        if self.version == 1:
            ids = {id(p) for p in params}
            for root in self.sharded.roots:
                if is_fsdp1(root) and ids == {id(p) for p in root.parameters()}:
                    return root.clip_grad_norm_(max_norm, norm_type)
        return clip_grad_norm_sharded_(params, float(max_norm), float(norm_type), local_shards=self.version == 1)

def _on_any_rank(flag: bool) -> bool:
    """Whether `flag` holds on some process: decisions that raise must be taken by all processes together.

    A control collective (a CPU tensor on the gloo control group): on the default NCCL group this CPU flag
    stopped every sharded run on a GPU at `prepare()`."""
    from ...distributed.control import any_rank

    return any_rank(flag)


def _stream_weights_from_rank0(model, full: dict, device=None) -> None:
    """Fill a freshly sharded (empty) model from rank 0's tensors, one tensor at a time, walking the model once
    (`parallelize/streaming.py`; `parallelize.fsdp.apply_fsdp` does the same for cpu_ram_efficient_loading)."""
    from ...parallelize.streaming import stream_from_rank0

    stream_from_rank0(_named_tensors(model), full, torch.device(device or "cpu"), consume=True)
