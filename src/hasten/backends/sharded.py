"""What the backends whose layout replaces a model's parameters (FSDP shards, tensor-parallel DTensors, pipeline
stages) keep about the result, as one helper object each of them holds (`ShardedModels`), never as a base class:
which models are prepared, which new parameter replaced each old one (so the user's optimizer is re-pointed), the
roots whose parameters an optimizer may update, CPU offload's decision on a CPU run, gradient sync for accumulation,
and checkpoints through torch.distributed.checkpoint in Accelerate's FSDP folders (`fsdp/checkpoint.py`)."""

from __future__ import annotations

import contextlib
import warnings

import torch
from torch.utils.weak import WeakIdKeyDictionary

from ..checkpoint.storage import durable
from ..core.errors import CheckpointError, ConfigError
from ..optimizer import inner_optimizer
from ..state import GradientState
from .fsdp import checkpoint as fsdp_checkpoint
from .unwrap import is_fsdp1, is_fsdp2


class ShardedModels:
    def __init__(self, plugin, device):
        self.plugin = plugin
        self.device = device
        # user's module -> what prepare_model returns (the same module for FSDP2, the FSDP1 container for 1)
        self.prepared = WeakIdKeyDictionary()
        # parameter the user's optimizer may still hold -> the parameter that replaced it
        self.replacement = WeakIdKeyDictionary()
        self.roots: list = []  # every prepared model, to find a parameter's owner (clipping, optimizer state)
        self.offload_dropped = False  # cpu_offload on a CPU run: left out, with a warning (check_offload)

    # -- CPU offload ----------------------------------------------------------------------------------------------
    def lay_out_all(self, models, lay_out) -> None:
        """`lay_out(model)` for every model of one prepare() call not laid out yet (nor prepared by an earlier
        Accelerator), kept as its prepared form."""
        for model in models:
            if model not in self.prepared and not getattr(model, "_is_accelerate_prepared", False):
                self.prepared[model] = lay_out(model)

    def lay_out(self, model, lay_out):
        """The prepared form of `model`: `lay_out(model)` the first time, the same object after."""
        if model not in self.prepared:
            self.prepared[model] = lay_out(model)
        return self.prepared[model]

    def check_offload(self) -> None:
        if self.plugin.offloads_params and self.device.type == "cpu" and not self.offload_dropped:
            # torch's FSDP offload needs an accelerator ("Cannot access accelerator device when none is available",
            # where Accelerate hands it on); on a CPU run the parameters live in CPU memory anyway: one config
            # from laptop to cluster, so the offload is left out here with one warning, refused under strict.
            from ..config.resolve import strict

            if strict():
                raise ConfigError(
                    "fsdp cpu_offload (--fsdp_offload_params) keeps parameters in CPU memory between uses, but this "
                    "run's device is already the CPU; set fsdp_offload_params to false (an error under hasten's strict "
                    "setting)"
                )
            warnings.warn("fsdp cpu_offload (--fsdp_offload_params): this run trains on the CPU, where the parameters "
                          "already are, so hasten shards without torch's CPU offload (nothing changes on a CPU; on a "
                          "GPU run it offloads)", stacklevel=2)
            self.offload_dropped = True

    @property
    def offloads_params(self) -> bool:
        """Whether the shards live in CPU memory between uses: the plugin's cpu_offload, but not on a CPU run."""
        return self.plugin.offloads_params and not self.offload_dropped

    def offload_setting(self):
        """The plugin's `cpu_offload` object, or the version's "no offload" one where the offload was left out."""
        if not self.offload_dropped:
            return self.plugin.cpu_offload
        from torch.distributed.fsdp import CPUOffload, OffloadPolicy

        return CPUOffload(offload_params=False) if self.plugin.fsdp_version == 1 else OffloadPolicy()

    # -- FSDP2 ------------------------------------------------------------------------------------------------------
    def shard_fsdp2(self, model, mesh, precision_mode: str, steps=(None, None)):
        """The FSDP2 layout step (`parallelize.fsdp.apply_fsdp`) on `model` over `mesh`, remembered here. `steps`:
        Accelerate's wrap policy and upcast when its `fsdp2_prepare_model` called."""
        from ..parallelize import fsdp
        from .fsdp.pretrained import save_pretrained_with_whole_weights

        if not any(True for _ in model.parameters()):
            return model.to(self.device)
        self.check_offload()
        fsdp.refuse_meta(model, self.plugin, fsdp2=True)
        wrap_policy, upcast = steps
        replaced = fsdp.apply_fsdp(model, self.plugin, mesh, device=self.device, precision_mode=precision_mode,
                                   offload_policy=self.offload_setting(), offloads=self.offloads_params,
                                   wrap_policy=wrap_policy, upcast=upcast)
        for old, new in replaced:
            self.replacement[old] = new
        save_pretrained_with_whole_weights(model)  # its own state_dict() now holds shards (pretrained.py)
        self.roots.append(model)
        return model

    # -- optimizers ---------------------------------------------------------------------------------------------
    def repoint(self, optimizer) -> None:
        """Make an optimizer built on the unsharded model update the sharded parameters instead."""
        for group in optimizer.param_groups:
            params = group["params"]
            found = [self.replacement.get(p) for p in params]
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
            missing = [i for i, r in enumerate(found) if r is None and not any(p is params[i] for p in self.all_params())]
            if missing:
                raise ConfigError(
                    f"{len(missing)} parameters of {type(optimizer).__name__} do not belong to any prepared model "
                    "after sharding (tied weights shared across FSDP units?); tie them inside one wrapped block, "
                    "or create the optimizer after prepare()"
                )
            group["params"] = [r if r is not None else p for p, r in zip(params, found)]

    def all_params(self):
        for root in self.roots:
            yield from root.parameters()

    def owner_of(self, optimizer):
        """The sharded model whose parameters `optimizer` updates."""
        params = {id(p) for group in inner_optimizer(optimizer).param_groups for p in group["params"]}
        for root in self.roots:
            if any(id(p) in params for p in root.parameters()):
                return root
        raise ConfigError(
            f"{type(inner_optimizer(optimizer)).__name__} updates no parameter of a model prepared with FSDP; pass the model "
            "to prepare() as well"
        )

    # -- the training step ----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def gradient_sync(self, model, enabled: bool):
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

    @staticmethod
    def refuse_mid_window() -> None:
        if not GradientState().sync_gradients:
            raise CheckpointError(
                "save_state() in the middle of a gradient accumulation window: under FSDP the partial gradient sum "
                "lives in FSDP's unsharded parameters, which no checkpoint holds; save after a step where "
                "accelerator.sync_gradients is True"
            )

    def save(self, folder, models, optimizers, before_write=None) -> list:
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

    def stage(self, folder, models, optimizers, *, rank=0, before_write=None, stage=None, dcp_group=None) -> list:
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
                files.append((name, lambda p, s=stage(state, name): durable.save_object(s, p)))
        return files

    def load(self, folder, models, optimizers, *, map_location="cpu", load_kwargs=None, strict=True) -> None:
        """Read what `save` wrote, whatever number of processes wrote it. `strict` as in `load_state_dict`;
        `map_location` and `load_kwargs` apply to whole (FULL_STATE_DICT) files, sharded state is read straight
        into each process's shards."""
        for index, model in enumerate(models):
            fsdp_checkpoint.load_model(model, folder, index, strict=strict, map_location=map_location,
                                       load_kwargs=load_kwargs)
        for index, optimizer in enumerate(optimizers):
            fsdp_checkpoint.load_optimizer(self.owner_of(optimizer), inner_optimizer(optimizer), folder, index,
                                           map_location=map_location, load_kwargs=load_kwargs)


def delegate_to_sharded(cls):
    """Class decorator: the backend methods that a backend holding `self.sharded` (a ShardedModels) answers by
    delegation alone: which prepared optimizer owns a parameter, gradient sync for accumulation, and checkpoints
    (full state dict, the mid-window refusal, DCP save/stage/load). A method the class defines itself is kept.
    Composition, not inheritance: the class's MRO stays (cls, Backend, object)."""
    from .base import Backend, refuse_load_kwargs

    def owner_of(self, optimizer):
        return self.sharded.owner_of(optimizer)

    def no_sync(self, model):
        """Backward keeps whole (unsharded) gradients locally; the next synced backward reduces their sum."""
        return self.sharded.gradient_sync(model, enabled=False)

    def trigger_sync_in_backward(self, model):
        return self.sharded.gradient_sync(model, enabled=True)

    def full_state_dict(self, model, unwrap=True):
        return self.sharded.full_state_dict(model, unwrap)

    def check_save_kwargs(self, save_model_func_kwargs: dict) -> None:
        Backend.check_save_kwargs(self, save_model_func_kwargs)
        self.sharded.refuse_mid_window()

    def save_model_and_optimizer(self, folder, models, optimizers, *, writer=True, rank=0, safe_serialization=True,
                                 before_write=None, **save_model_func_kwargs) -> list:
        return self.sharded.save(folder, models, optimizers, before_write)

    def stage_model_and_optimizer(self, folder, models, optimizers, *, writer=True, rank=0, safe_serialization=True,
                                  before_write=None, stage=None, dcp_group=None, **save_model_func_kwargs) -> list:
        return self.sharded.stage(folder, models, optimizers, rank=rank, before_write=before_write, stage=stage,
                                  dcp_group=dcp_group)

    def load_model_and_optimizer(self, folder, models, optimizers, *, map_location="cpu", load_kwargs=None,
                                 strict=True, **load_model_func_kwargs) -> None:
        refuse_load_kwargs(self, load_model_func_kwargs, accepted=())
        self.sharded.load(folder, models, optimizers, map_location=map_location, load_kwargs=load_kwargs,
                          strict=strict)

    for method in (owner_of, no_sync, trigger_sync_in_backward, full_state_dict, check_save_kwargs,
                   save_model_and_optimizer, stage_model_and_optimizer, load_model_and_optimizer):
        if method.__name__ not in vars(cls):
            method.__qualname__ = f"{cls.__name__}.{method.__name__}"
            setattr(cls, method.__name__, method)
    return cls


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
