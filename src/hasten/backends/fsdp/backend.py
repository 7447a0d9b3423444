"""Sharded data parallel with PyTorch FSDP: each process keeps only its shard of parameters, gradients and
optimizer state, and gathers whole parameters just for the forward and backward of one block.

FSDP2 (`fully_shard`, the default for new code) changes modules in place and turns parameters into
DTensors, so optimizers built before `prepare` are re-pointed at the new parameters here (`prepare_together`).
FSDP1 (`FullyShardedDataParallel`) wraps the module in a container. Both run on CPU processes with gloo.

Checkpoints of sharded state go through torch.distributed.checkpoint (see `checkpoint.py` beside this module), so a run
saved by N processes loads into M.
"""

from __future__ import annotations

import contextlib
import functools
import warnings

import torch
import torch.distributed as dist
from torch.utils.weak import WeakIdKeyDictionary

from ...core.errors import CheckpointError, ConfigError
from ...distributed.bootstrap import init_single_process_group
from ...distributed.grad_norm import clip_grad_norm_sharded_
from ...optimizer import inner_optimizer
from ...state import GradientState
from ..base import Backend, refuse_load_kwargs
from ..unwrap import is_fsdp1, is_fsdp2
from . import checkpoint as fsdp_checkpoint
from ...parallelize import fsdp as sharding
from .pretrained import save_pretrained_with_whole_weights
from ...parallelize.fsdp import checkpoint_wrap_blocks, load_full_state_dict, materialize  # noqa: F401 - published here too
from ...parallelize.fsdp import named_tensors as _named_tensors, plain_named_parameters, state_name  # noqa: F401

# what torch's CheckpointWrapper inserts into the names of the parameters below it


def _ignored_modules(model, ignored) -> list:
    """The plugin's `ignored_modules` as modules: given as modules, or as a regex every full name must match."""
    if ignored is None:
        return []
    if isinstance(ignored, str):
        import re

        pattern = re.compile(ignored)
        return [module for name, module in model.named_modules() if pattern.fullmatch(name)]
    return list(ignored)


class FSDPBackend(Backend):
    name = "fsdp"
    supports_clip_grad_value = False  # a value clip on shards is fine, but Accelerate refuses it: keep one rule

    @property
    def regional_compilation_in_place(self) -> bool:
        return self.version == 2  # as Accelerate: FSDP2's hooks must stay on the call path; FSDP1 gets a new tree

    @property
    def accelerate_fsdp2_step(self) -> bool:
        """Whether `prepare` takes Accelerate's FSDP2 step (`Accelerator._prepare_fsdp2`, sharding each model
        through `fsdp2_prepare_model`) before `prepare_together`: plain FSDP2, not the layout backends (tensor,
        pipeline parallel), which shard in their own way and say so themselves."""
        return self.version == 2

    def __init__(self, state, plan, precision=None, ddp_kwargs=None):
        super().__init__(state, plan, precision=precision, ddp_kwargs=ddp_kwargs)
        self.version = self.plugin.fsdp_version
        # user's module -> what prepare_model returns (the same module for FSDP2, the FSDP1 container for 1)
        self._prepared = WeakIdKeyDictionary()
        # parameter the user's optimizer may still hold -> the sharded parameter that replaced it
        self._replacement = WeakIdKeyDictionary()
        self._roots: list = []  # every sharded model, to find a parameter's owner (clipping, optimizer state)
        self._mesh = None
        self._offload_dropped = False  # cpu_offload on a CPU run: left out, with a warning (_check_device)

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
        for model in models:
            if model not in self._prepared and not getattr(model, "_is_accelerate_prepared", False):
                self._prepared[model] = self._shard(model)
        for optimizer in optimizers:
            self._repoint(inner_optimizer(optimizer))

    def prepare_model(self, model, device_placement, evaluation_mode):
        if model not in self._prepared:
            self._prepared[model] = self._shard(model)
        return self._prepared[model]

    def _check_device(self):
        device = self.state.device
        strategy = getattr(self.plugin.sharding_strategy, "name", "")
        if self.version == 1 and device.type == "cpu" and strategy.lstrip("_").startswith("HYBRID_SHARD"):
            raise ConfigError(
                f"fsdp sharding_strategy {strategy} (FSDP1) silently diverges on CPU processes; for hybrid sharding "
                "use ParallelismConfig(dp_replicate_size=..., dp_shard_size=...) (FSDP2 HSDP)"
            )
        if self.plugin.offloads_params and device.type == "cpu" and not self._offload_dropped:
            # torch's FSDP offload needs an accelerator ("Cannot access accelerator device when none is available",
            # where Accelerate hands it on); on a CPU run the parameters live in CPU memory anyway: one config
            # from laptop to cluster, so the offload is left out here with one warning, refused under strict.
            from ...config.resolve import strict

            if strict():
                raise ConfigError(
                    "fsdp cpu_offload (--fsdp_offload_params) keeps parameters in CPU memory between uses, but this "
                    "run's device is already the CPU; set fsdp_offload_params to false (an error under hasten's strict "
                    "setting)"
                )
            warnings.warn("fsdp cpu_offload (--fsdp_offload_params): this run trains on the CPU, where the parameters "
                          "already are, so hasten shards without torch's CPU offload (nothing changes on a CPU; on a "
                          "GPU run it offloads)", stacklevel=2)
            self._offload_dropped = True

    @property
    def offloads_params(self) -> bool:
        """Whether the shards live in CPU memory between uses: the plugin's cpu_offload, but not on a CPU run."""
        return self.plugin.offloads_params and not self._offload_dropped

    def _offload_setting(self):
        """The plugin's `cpu_offload` object, or the version's "no offload" one where the offload was left out."""
        if not self._offload_dropped:
            return self.plugin.cpu_offload
        from torch.distributed.fsdp import CPUOffload, OffloadPolicy

        return CPUOffload(offload_params=False) if self.version == 1 else OffloadPolicy()

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
        self._device_mesh()  # also makes a one-process group when the script was not launched
        ram_efficient = self.plugin.cpu_ram_efficient_loading
        if self.version == 2 and not ram_efficient and _on_any_rank(any(p.is_meta for p in model.parameters())):
            raise ConfigError(
                "prepare() got a model with parameters on the meta device; load its weights first, or build it on the "
                "meta device on every process but rank 0 and set fsdp cpu_ram_efficient_loading=True"
            )
        if ram_efficient and _on_any_rank(dist.get_rank() == 0 and any(p.is_meta for p in model.parameters())):
            raise ConfigError(
                "fsdp cpu_ram_efficient_loading: rank 0 must build the model with its real weights (the others may use "
                "the meta device), but rank 0's model has parameters on the meta device"
            )
        if self.version == 2:
            sharded = self._shard_fsdp2(model, ram_efficient)
        else:
            sharded = self._shard_fsdp1(model)
        self._roots.append(sharded)
        return sharded

    def _ignored_params(self, model) -> set:
        return {p for module in _ignored_modules(model, self.plugin.ignored_modules) for p in module.parameters()}

    def prepare_fsdp2_model(self, model, wrap_policy=None, upcast=None):
        """`prepare_model` for Accelerate's `fsdp2_prepare_model`, which hands in its own (patchable) wrap policy
        `(plugin, model) -> predicate or None` and upcast `(model, mixed_precision, is_main_process)`."""
        self._fsdp2_steps = (wrap_policy, upcast)
        try:
            return self.prepare_model(model, device_placement=True, evaluation_mode=False)
        finally:
            self._fsdp2_steps = (None, None)

    def _shard_fsdp2(self, model, ram_efficient: bool):
        # The steps Accelerate's fsdp2_prepare_model takes; the policy and the upcast are the ones its
        # `utils.fsdp_utils` handed in (prepare_fsdp2_model), so a script's mock.patch of them reaches the run.
        wrap_policy, upcast = getattr(self, "_fsdp2_steps", (None, None))
        plugin = self.plugin
        (upcast or sharding.upcast_for_fsdp2)(model, self.precision.mode, dist.get_rank() == 0)
        old_params = plain_named_parameters(model)
        if ram_efficient:
            # Everyone shards an empty (meta) model; rank 0 then streams its weights in tensor by tensor. fp8 layers
            # (torchao) were swapped in before, on rank 0's real weights and the others' meta ones alike: rank 0 keeps
            # the plain tensors inside their fp8 wrappers, which the move to meta would empty.
            full = {}
            if dist.get_rank() == 0:
                full = {name: sharding.plain_tensor(t) for name, t in _named_tensors(model).items()}
            ties = sharding.shared_parameters(model)
            model.to("meta")
        if plugin.activation_checkpointing:
            # As Accelerate's prepare (fsdp2_apply_ac): each block inside torch's CheckpointWrapper, before sharding.
            checkpoint_wrap_blocks(model, plugin.wrap_predicate(model), offload=plugin.activation_checkpointing_offload)
        kwargs = sharding.shard_kwargs(plugin, self._device_mesh(), offload_policy=self._offload_setting())
        ignored = self._ignored_params(model)
        if ignored:
            kwargs["ignored_params"] = ignored

        def free_replaced(module, replaced):
            if ram_efficient:
                return
            # Free each whole parameter once its shard exists (the user's optimizer still holds the old
            # object until it is re-pointed), so the peak is one copy plus a block, not one and a half copies.
            still_used = {id(p) for _, p in model.named_parameters(remove_duplicate=False)}
            for old in replaced:
                if id(old) not in still_used:
                    old.data = torch.empty(0, dtype=old.dtype, device=old.device)

        wants_own_unit = wrap_policy(plugin, model) if wrap_policy is not None else plugin.wrap_predicate(model)
        sharding.shard_units(model, kwargs, wants_own_unit, can_be_unit=_can_be_unit, after_unit=free_replaced)
        if ram_efficient:
            materialize(model, self.state.device, offload=self.offloads_params)
            sharding.retie(ties)
            _stream_weights_from_rank0(model, full, self.state.device)
        new_params = plain_named_parameters(model)
        for name, old in old_params.items():
            if name in new_params and new_params[name] is not old:
                self._replacement[old] = new_params[name]
        save_pretrained_with_whole_weights(model)  # its own state_dict() now holds shards (pretrained.py)
        return model

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
                                           lambda_fn=lambda module: _can_be_unit(module) and predicate(module))
            else:
                policy = None
        if plugin.activation_checkpointing:
            _apply_activation_checkpointing(model, plugin.wrap_predicate(model), composable=False)
        ignored = _ignored_modules(model, plugin.ignored_modules) or None
        old_params = list(model.parameters())
        wrapped = FullyShardedDataParallel(
            model,
            sharding_strategy=plugin.sharding_strategy,
            cpu_offload=self._offload_setting(),
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
                self._replacement[old] = flat
        return wrapped

    def _repoint(self, optimizer) -> None:
        """Make an optimizer built on the unsharded model update the sharded parameters instead."""
        for group in optimizer.param_groups:
            params = group["params"]
            found = [self._replacement.get(p) for p in params]
            if not any(r is not None for r in found):
                continue
            if any(p in optimizer.state and optimizer.state[p] for p in params):
                raise ConfigError(
                    f"{type(optimizer).__name__} already has state for the unsharded parameters (it stepped before "
                    "prepare); with FSDP create or reset the optimizer before calling prepare()"
                )
            if isinstance(found[0], list):  # FSDP1 flat parameters replace the whole group
                if len(optimizer.param_groups) > 1:
                    raise ConfigError(
                        f"{type(optimizer).__name__} has {len(optimizer.param_groups)} parameter groups, which FSDP1 "
                        "with use_orig_params=False cannot keep apart; set fsdp use_orig_params=True or use fsdp_version=2"
                    )
                group["params"] = list(found[0])
                continue
            missing = [i for i, r in enumerate(found) if r is None and not any(p is params[i] for p in self._all_params())]
            if missing:
                raise ConfigError(
                    f"{len(missing)} parameters of {type(optimizer).__name__} do not belong to any prepared model "
                    "after sharding (tied weights shared across FSDP units?); tie them inside one wrapped block, "
                    "or create the optimizer after prepare()"
                )
            group["params"] = [r if r is not None else p for p, r in zip(params, found)]

    def _all_params(self):
        for root in self._roots:
            yield from root.parameters()

    def owner_of(self, optimizer):
        """The sharded model whose parameters `optimizer` updates."""
        params = {id(p) for group in inner_optimizer(optimizer).param_groups for p in group["params"]}
        for root in self._roots:
            if any(id(p) in params for p in root.parameters()):
                return root
        raise ConfigError(
            f"{type(inner_optimizer(optimizer)).__name__} updates no parameter of a model prepared with FSDP; pass the model "
            "to prepare() as well"
        )

    # -- the training step ----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _gradient_sync(self, model, enabled: bool):
        if is_fsdp2(model):
            before = _requires_gradient_sync(model)
            model.set_requires_gradient_sync(enabled)
            try:
                yield
            finally:
                model.set_requires_gradient_sync(before)  # what it was, not `not enabled`: nesting restores
        elif is_fsdp1(model) and not enabled:
            with model.no_sync():
                yield
        else:
            yield

    def no_sync(self, model):
        """Backward keeps whole (unsharded) gradients locally; the next synced backward reduces their sum."""
        return self._gradient_sync(model, enabled=False)

    def trigger_sync_in_backward(self, model):
        return self._gradient_sync(model, enabled=True)

    def clip_grad_norm_(self, parameters, max_norm, norm_type=2.0):
        """Clip by the norm over all shards on all processes; returns that global norm (the same on every rank)."""
        params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        if self.version == 1:
            ids = {id(p) for p in params}
            for root in self._roots:
                if is_fsdp1(root) and ids == {id(p) for p in root.parameters()}:
                    return root.clip_grad_norm_(max_norm, norm_type)
        return clip_grad_norm_sharded_(params, float(max_norm), float(norm_type), local_shards=self.version == 1)

    # -- checkpoints ----------------------------------------------------------------------------------------
    def full_state_dict(self, model, unwrap=True):
        """The whole model's state, gathered one tensor at a time and kept as the plugin's `state_dict_config`
        says (by default on the main process only, in CPU memory). `unwrap=False` keeps the key prefixes of
        the wrappers around the sharded model (`_orig_mod.` of torch.compile), as `model.state_dict()` of the
        prepared object names them; `unwrap=True` gives the bare module's names."""
        state = fsdp_checkpoint.full_model_state_dict(model, self.plugin.state_dict_config)
        if unwrap:
            return state
        prefix = _wrapper_prefix(model)
        return {prefix + key: value for key, value in state.items()} if prefix else state

    def check_save_kwargs(self, save_model_func_kwargs: dict) -> None:
        super().check_save_kwargs(save_model_func_kwargs)
        if not GradientState().sync_gradients:
            raise CheckpointError(
                "save_state() in the middle of a gradient accumulation window: under FSDP the partial gradient sum "
                "lives in FSDP's unsharded parameters, which no checkpoint holds; save after a step where "
                "accelerator.sync_gradients is True"
            )

    def save_model_and_optimizer(self, folder, models, optimizers, *, writer=True, rank=0, safe_serialization=True,
                                 before_write=None, **save_model_func_kwargs) -> list:
        """Write the models' and optimizers' state into `folder` with Accelerate's FSDP names.

        SHARDED_STATE_DICT: every process writes its own shard into `pytorch_model_fsdp_<i>/` and `optimizer_<i>/`
        (torch.distributed.checkpoint); FULL_STATE_DICT: the main process writes `pytorch_model_fsdp[_<i>].bin`
        and `optimizer[_<i>].bin`, gathered one tensor at a time. Save hooks see no weights (there is no whole
        state dict to hand them). Returns the names this process wrote.
        """
        if before_write is not None:
            before_write([])
        sharded = fsdp_checkpoint.is_sharded(self.plugin)
        model_config, optim_config = self.plugin.state_dict_config, self.plugin.optim_state_dict_config
        written = [fsdp_checkpoint.save_model(model, folder, index, sharded, model_config)
                   for index, model in enumerate(models)]
        written += [
            fsdp_checkpoint.save_optimizer(self.owner_of(optimizer), inner_optimizer(optimizer), folder, index, sharded,
                                           optim_config)
            for index, optimizer in enumerate(optimizers)
        ]
        return [name for name in written if name is not None]

    def stage_model_and_optimizer(self, folder, models, optimizers, *, writer=True, rank=0, safe_serialization=True,
                                  before_write=None, stage=None, dcp_group=None, **save_model_func_kwargs) -> list:
        """The asynchronous save of the same files. SHARDED_STATE_DICT: `torch.distributed.checkpoint.async_save`
        stages each process's shards to CPU memory now and uploads them in its own thread, on a gloo group of
        its own (`dcp_group()`); the returned write waits for that upload. FULL_STATE_DICT: the whole state is
        gathered now (a collective) and staged on the main process, which writes it in the background."""
        if before_write is not None:
            before_write([])
        sharded = fsdp_checkpoint.is_sharded(self.plugin)
        pairs = [(fsdp_checkpoint.MODEL_NAME, index, model, None) for index, model in enumerate(models)]
        pairs += [(fsdp_checkpoint.OPTIMIZER_NAME, index, self.owner_of(optimizer), inner_optimizer(optimizer))
                  for index, optimizer in enumerate(optimizers)]
        files = []
        for stem, index, model, optimizer in pairs:
            if sharded:
                future = fsdp_checkpoint.async_save_sharded(model, optimizer, folder, index, dcp_group())
                files.append((fsdp_checkpoint.sharded_name(stem, index), lambda p, f=future: f.result()))
                continue
            state = (fsdp_checkpoint.full_model_state_dict(model, self.plugin.state_dict_config) if optimizer is None
                     else fsdp_checkpoint.full_optimizer_state_dict(model, optimizer, self.plugin.optim_state_dict_config))
            if rank == 0:
                name = fsdp_checkpoint.full_name(stem, index)
                files.append((name, lambda p, s=stage(state, name): torch.save(s, p)))
        return files

    def load_model_and_optimizer(self, folder, models, optimizers, *, map_location="cpu", load_kwargs=None,
                                 strict=True, **load_model_func_kwargs) -> None:
        """Read what `save_model_and_optimizer` wrote, whatever number of processes wrote it. `strict` as in
        `load_state_dict`; `map_location` and `load_kwargs` apply to whole (FULL_STATE_DICT) files, sharded state
        is read straight into each process's shards."""
        refuse_load_kwargs(self, load_model_func_kwargs, accepted=())
        for index, model in enumerate(models):
            fsdp_checkpoint.load_model(model, folder, index, strict=strict, map_location=map_location,
                                       load_kwargs=load_kwargs)
        for index, optimizer in enumerate(optimizers):
            fsdp_checkpoint.load_optimizer(self.owner_of(optimizer), inner_optimizer(optimizer), folder, index,
                                           map_location=map_location, load_kwargs=load_kwargs)


def _wrapper_prefix(model) -> str:
    """`_orig_mod.` (repeated) for each torch.compile wrapper around the sharded module; '' for none."""
    prefix = ""
    while isinstance(getattr(model, "_orig_mod", None), torch.nn.Module):
        prefix, model = prefix + "_orig_mod.", model._orig_mod
    return prefix


def _requires_gradient_sync(model) -> bool:
    """Whether an FSDP2 model reduce-scatters in backward now (the flag `set_requires_gradient_sync` sets)."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            state = module._get_fsdp_state()
            groups = getattr(state, "_fsdp_param_groups", None)  # torch >= 2.10; one group before
            groups = groups if groups is not None else [state._fsdp_param_group]
            for group in groups:
                if group is not None:
                    return bool(group.reduce_grads)
    return True


def _on_any_rank(flag: bool) -> bool:
    """Whether `flag` holds on some process: decisions that raise must be taken by all processes together.

    A control collective (a CPU tensor on the gloo control group): on the default NCCL group this CPU flag
    stopped every sharded run on a GPU at `prepare()`."""
    from ...distributed.control import any_rank

    return any_rank(flag)


def _can_be_unit(module) -> bool:
    """fully_shard needs a module that runs (not a ModuleList/ModuleDict container) and has parameters; an
    activation-checkpointing wrapper is not one (the block inside it is)."""
    has_forward = type(module).forward is not torch.nn.Module.forward
    return has_forward and not _is_checkpoint_wrapper(module) and any(True for _ in module.parameters())


def _is_checkpoint_wrapper(module) -> bool:
    return hasattr(module, "_checkpoint_wrapped_module")





def _stream_weights_from_rank0(model, full: dict, device=None) -> None:
    """Fill a freshly sharded (empty) model from rank 0's tensors, one tensor at a time (see streaming.py).

    Rank 0 drops each whole tensor as soon as it is sent, so its memory goes from one whole copy down to its
    shard while the others grow from nothing to theirs: no process ever holds two copies. Buffers, non-persistent
    ones included (they are in no state dict), come from rank 0 too.
    """
    from .streaming import stream_from_rank0

    stream_from_rank0(_named_tensors(model), full, torch.device(device or "cpu"), consume=True)




def _apply_activation_checkpointing(model, predicate, composable: bool) -> None:
    """Recompute the activations of each wrapped block in backward instead of keeping them."""
    if predicate is None:
        raise ConfigError(
            "fsdp activation_checkpointing needs an auto_wrap_policy (TRANSFORMER_BASED_WRAP or SIZE_BASED_WRAP) to "
            "know which blocks to recompute"
        )
    blocks = [m for m in model.modules() if m is not model and predicate(m)]
    if composable:
        from torch.distributed._composable import checkpoint

        for block in blocks:
            checkpoint(block)  # in place: parameter names (and checkpoints) stay the same
        return
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        apply_activation_checkpointing,
        checkpoint_wrapper,
    )

    chosen = {id(b) for b in blocks}
    apply_activation_checkpointing(
        model, checkpoint_wrapper_fn=functools.partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT),
        check_fn=lambda m: id(m) in chosen,
    )

