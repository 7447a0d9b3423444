"""The one interface every way of distributing a model implements.

The facade (`Accelerator`) never asks which backend it has; it asks the backend. A new backend is one
module in this package plus one line in `REGISTRY` (see `__init__.py`).

A backend answers, for its strategy:

- preparing:   `prepare_together`, `prepare_model`, `prepare_optimizer`, `prepare_scheduler` (the last two
               return the objects whose `step`/`zero_grad` the script calls: a backend whose engine steps
               itself returns wrappers that leave that to the engine); around them the layout's own steps,
               which the facade calls for every run: `before_prepare`, `after_prepare`, `layout_model`,
               `layout_loader`, `layout_optimizer` (sequence parallelism, Megatron-LM's clipping, Ulysses loaders)
- precision:   `make_grad_scaler` (from the run's `PrecisionPolicy`, given at construction; a backend whose
               engine applies precision itself replaces `self.precision`, and the facade uses the backend's)
- accumulation: `accumulation_steps` (agree the Accelerator's steps with the backend's own setting)
- one step:    `backward` (gets the raw loss and the accumulation steps: a backend whose engine divides the
               loss itself skips the division), `no_sync`, `trigger_sync_in_backward`, `clip_grad_norm_`,
               `clip_grad_value_` where `supports_clip_grad_value`
- checkpoints: `save_model_and_optimizer` / `load_model_and_optimizer` (the model and optimizer files of a
               `save_state` folder: safetensors/bin here, DCP folders for FSDP, an engine's own files for
               DeepSpeed), and `full_state_dict` (`save_model`, `get_state_dict`)
- unwrapping:  `unwrap_model`
"""

from __future__ import annotations

import contextlib
import os

import torch

from ..checkpoint import files
from ..checkpoint.storage import durable, fast_io
from ..config.resolve import strict
from ..core.errors import CheckpointError, ConfigError
from ..optimizer import AcceleratedOptimizer
from ..scheduler import AcceleratedScheduler
from ..training.precision import PrecisionPolicy
from .unwrap import unwrap_model

def refuse_load_kwargs(backend, load_model_func_kwargs: dict, accepted: tuple) -> None:
    """One line naming the load_state() keywords this backend has nowhere to pass (Accelerate drops them)."""
    unknown = sorted(set(load_model_func_kwargs) - set(accepted))
    if unknown:
        takes = f"it takes {', '.join(accepted)} besides map_location" if accepted else "it takes map_location and strict"
        raise ConfigError(
            f"load_state() got {', '.join(unknown)}, which the {backend.name} backend has nowhere to pass ({takes}); "
            "fix: drop them"
        )


class Backend:
    """Single-process defaults; distributed backends override what differs."""

    name = "base"
    #: Whether `clip_grad_value_` is meaningful (not for sharded parameters).
    supports_clip_grad_value = True
    #: Accelerate's `accelerator.deepspeed_engine_wrapped`: the engine a backend drives, if it has one.
    engine_wrapper = None
    #: How `prepare` compiles regions (`use_regional_compilation`), as Accelerate per backend: False returns a new
    #: module tree whose compiled blocks hold the original in `_orig_mod`; True compiles each block in place
    #: (engines whose hooks a new tree would bypass: FSDP2, DeepSpeed).
    regional_compilation_in_place = False
    #: Whether `prepare` takes Accelerate's FSDP2 step (`Accelerator._prepare_fsdp2`, whose names scripts patch).
    accelerate_fsdp2_step = False
    #: DeepSpeed's Ulysses process groups once an engine is built with sp (prepared loaders are then adapted).
    ulysses_mpu = None
    #: `clip_grad_value_`'s `foreach` (None: torch's choice; False where torch's fused clamp refuses the gradients).
    clip_value_foreach = None

    def __init__(self, state, plan, precision: PrecisionPolicy | None = None, ddp_kwargs=None):
        self.state = state
        self.plan = plan  # the run plan (hasten/plan/): every setting this backend is built from
        self.precision = precision if precision is not None else PrecisionPolicy.from_plan(plan, state.device)
        self.ddp_kwargs = ddp_kwargs
        self.plugin = plan.sharding_plugin  # the FSDP(2) settings, for the backends that shard

    # -- preparing objects ----------------------------------------------------------------------------------
    def prepare_model(self, model: torch.nn.Module, device_placement: bool, evaluation_mode: bool) -> torch.nn.Module:
        """Place (and, for distributed backends, wrap) one model."""
        if device_placement:
            model = model.to(self.state.device)
        return model

    def prepare_together(self, models: list, optimizers: list, schedulers=(), data_loaders=(), split_batches=False,
                         accumulation_steps: int = 1) -> None:
        """Hook for backends that must see everything one `prepare` call got at once (sharding, an engine built
        from model, optimizer, scheduler and batch size together); default: nothing."""

    # -- the layout's steps around each object's wrapping (the facade calls them without knowing the layout) ---
    def before_prepare(self, models: list, optimizers: list, fsdp2_step, **together) -> None:
        """Everything one `prepare()` call got, before each object is wrapped: Accelerate's FSDP2 step where this
        backend takes it (`fsdp2_step(*models, *optimizers)`, the facade's `_prepare_fsdp2`: scripts patch its
        helper names on the accelerator module), then `prepare_together(models, optimizers, **together)`."""
        if self.accelerate_fsdp2_step:
            fsdp2_step(*models, *optimizers)
        self.prepare_together(models, optimizers, **together)

    def after_prepare(self, prepared: list, given: list, with_models: bool) -> list:
        """What one `prepare()` call returns (`prepared`, in the order of `given`): under DeepSpeed's Ulysses (its
        engine built with sp groups) the loaders prepared together with a model are adapted to those groups."""
        if not with_models or self.ulysses_mpu is None:
            return prepared
        from .deepspeed.ulysses import adapt_loader

        return [adapt_loader(obj, self.state.device, self.ulysses_mpu)
                if isinstance(original, torch.utils.data.DataLoader) else obj for obj, original in zip(prepared, given)]

    def layout_model(self, model: torch.nn.Module) -> None:
        """The layout's steps on a model as the script built it, before precision and wrapping: hasten's Ulysses
        sequence parallelism (`parallelize/sequence.py`) routes its attention over the whole sequence."""
        from ..parallelize.sequence import apply_sp

        apply_sp(model, self.plan.parallelism_config)

    def layout_loader(self, loader) -> None:
        """The layout's steps on a prepared loader, in place: under hasten's sequence parallelism each sp rank
        keeps its slice of the sequence."""
        from ..parallelize.sequence import shard_loader

        shard_loader(loader, self.plan.parallelism_config, self.state.device_mesh)

    def compile_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """The last layout step, on what `prepare_model` returned: torch.compile as the plan's dynamo plugin says
        (`parallelize/compile.py`); `model` itself when it says nothing."""
        from ..parallelize.compile import apply_compile

        return apply_compile(model, self.plan.dynamo_plugin, self.regional_compilation_in_place)

    def layout_optimizer(self, optimizer) -> None:
        """The layout's steps on a prepared optimizer: a Megatron-LM plugin's `gradient_clipping` clips the
        global norm (through this backend) before each step, as Megatron-LM's train step does."""
        plugin = self.plan.megatron_lm_plugin
        if plugin is not None:
            from ..config.megatron import clip_at_step

            clip_at_step(plugin, optimizer, self)

    def free_memory(self) -> None:
        """Release what the backend holds for prepared objects (`accelerator.free_memory()`)."""

    def prepare_optimizer(self, optimizer, device_placement: bool, scaler):
        """The object the script steps: steps and zeroes only on synchronisation steps, through `scaler`."""
        return AcceleratedOptimizer(optimizer, device_placement=device_placement, scaler=scaler)

    def prepare_scheduler(self, scheduler, optimizers: list, step_with_optimizer: bool, split_batches: bool):
        """The object the script steps: follows the real steps of the prepared optimizer (among `optimizers`, the
        facade's live list of prepared optimizers) that owns its optimizer. A scheduler whose optimizer was never
        prepared follows every prepared optimizer, as in Accelerate; under `strict()` it is an error."""
        target = getattr(scheduler, "optimizer", None)
        owners = [opt for opt in optimizers if getattr(opt, "optimizer", None) is target]
        if target is not None and not owners:
            if strict():
                raise ConfigError(
                    f"prepare() got a {type(scheduler).__name__} whose optimizer was not prepared: pass the optimizer "
                    "to prepare() as well (in the same call or before)"
                )
        # Accelerate hands its own list over, so a scheduler without an owner also follows optimizers prepared later.
        return AcceleratedScheduler(scheduler, owners or optimizers, step_with_optimizer=step_with_optimizer,
                                    split_batches=split_batches)

    # -- precision ------------------------------------------------------------------------------------------
    def make_grad_scaler(self):
        """The fp16 loss scaler the run uses, or None (no fp16, or the backend scales losses itself)."""
        if not self.precision.uses_grad_scaler:
            return None
        return torch.amp.GradScaler(self.precision.device_type, **self.precision.scaler_kwargs)

    # -- the training step ----------------------------------------------------------------------------------
    @property
    def plain_backward(self) -> bool:
        """True when `backward` is this class's own (divide, `loss.backward()`), so that without a scaler the
        facade may do that inline on every micro-step. A backend that owns backward (DeepSpeed's engine)
        overrides `backward` and is then always called."""
        return type(self).backward is Backend.backward

    def backward(self, loss: torch.Tensor, accumulation_steps: int = 1, scaler=None, **kwargs) -> None:
        """Backward of one micro-step's loss: divided by the accumulation steps, scaled for fp16."""
        if accumulation_steps != 1:
            loss = loss / accumulation_steps
        if scaler is not None:
            scaler.scale(loss).backward(**kwargs)
        else:
            loss.backward(**kwargs)

    def no_sync(self, model):
        """Context in which backward does not synchronise gradients across processes."""
        return contextlib.nullcontext()

    def trigger_sync_in_backward(self, model):
        return contextlib.nullcontext()

    def clip_grad_norm_(self, parameters, max_norm: float, norm_type: float = 2.0):
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)

    def clip_grad_value_(self, parameters, clip_value: float) -> None:
        """Clamp every gradient to [-clip_value, clip_value] (the facade asks `supports_clip_grad_value` first)."""
        # torch's fused (foreach) clamp refuses a mix of DTensor and plain gradients (tensor parallel layouts)
        torch.nn.utils.clip_grad_value_(parameters, clip_value, foreach=self.clip_value_foreach)

    # -- checkpoints ----------------------------------------------------------------------------------------
    def check_save_kwargs(self, save_model_func_kwargs: dict) -> None:
        """Called by `save_state` before anything is written: refuse what this backend cannot save as asked.
        `save_model_func_kwargs` go to an engine's own save function (DeepSpeed's `save_checkpoint`); here,
        where hasten writes the files itself, there is nothing to pass them to (Accelerate drops them)."""
        if save_model_func_kwargs:
            raise ConfigError(
                f"save_state() got {', '.join(sorted(save_model_func_kwargs))}: extra keywords go to DeepSpeed's "
                f"engine.save_checkpoint, and the {self.name} backend has none; fix: drop them"
            )

    def save_model_and_optimizer(self, folder: str, models: list, optimizers: list, *, writer: bool = True,
                                 rank: int = 0, safe_serialization: bool = True, before_write=None,
                                 **save_model_func_kwargs) -> list:
        """Write the models' and optimizers' state into `folder`; return the names (files or folders, relative
        to `folder`) this process wrote. Every process calls it (sharded backends gather or write collectively).

        `before_write(weights)` runs first with the list of model state dicts this backend is about to write
        (`[]` for backends that write no such dicts): `save_state` pre-hooks may change or drop them there.
        `writer` says whether this process writes the files every process shares (the main process, or each
        machine's with save_on_each_node). The caller makes the returned names durable before the commit.
        Here: `model[_i].safetensors` (or `pytorch_model[_i].bin`) and `optimizer[_i].bin`, Accelerate's layout.
        """
        written = self._model_and_optimizer_files(models, optimizers, writer, safe_serialization, before_write)
        for name, write in written:
            durable.write_file(os.path.join(folder, name), write, rank, sync=False)
        return [name for name, _ in written]

    def stage_model_and_optimizer(self, folder: str, models: list, optimizers: list, *, writer: bool = True,
                                  rank: int = 0, safe_serialization: bool = True, before_write=None, stage=None,
                                  dcp_group=None, **save_model_func_kwargs) -> list:
        """The asynchronous twin of `save_model_and_optimizer`: copy the state into CPU memory now (through
        `stage(obj, key)`) and return `[(name, write(path))]`, which a background thread runs in order into
        `folder`. A write may also wait for data another writer puts there (a DCP upload; `dcp_group()` gives
        each such upload its own gloo group). Every process calls it; a backend that writes its files another
        way and does not override this refuses."""
        if not self.supports_async_save:
            from ..checkpoint.async_save import refuse

            raise refuse(self)
        return self._model_and_optimizer_files(models, optimizers, writer, safe_serialization, before_write, stage)

    @property
    def supports_async_save(self) -> bool:
        """Whether `stage_model_and_optimizer` works here: this class's own files, or a backend's own staging."""
        cls = type(self)
        return (cls.stage_model_and_optimizer is not Backend.stage_model_and_optimizer
                or cls.save_model_and_optimizer is Backend.save_model_and_optimizer)

    def _model_and_optimizer_files(self, models, optimizers, writer, safe_serialization, before_write,
                                   stage=None) -> list:
        """[(name, write(path))] in Accelerate's layout; `stage` copies what the writes will read (async)."""
        weights = [model.state_dict() for model in models]  # wrapper prefixes kept, as Accelerate does
        if before_write is not None:
            before_write(weights)
        if not writer:
            return []
        return files.model_files(weights, safe_serialization, stage) + files.optimizer_files(optimizers, stage)

    def load_model_and_optimizer(self, folder: str, models: list, optimizers: list, *, map_location="cpu",
                                 load_kwargs: dict | None = None, strict: bool = True,
                                 **load_model_func_kwargs) -> None:
        """Restore what `save_model_and_optimizer` wrote (or what Accelerate wrote) into `models`/`optimizers`.

        Every process calls it. `load_kwargs` go to `torch.load` for pickled files (weights_only unless the
        user opted out); `strict` and `assign` (the other keyword `load_state_dict` takes) to `load_state_dict`."""
        refuse_load_kwargs(self, load_model_func_kwargs, accepted=("assign",))
        # Held until this returns: the .bin model files are read while the models load. Optimizer state is read
        # once the models loaded, into the optimizers' own tensors (a failed model load leaves them untouched).
        queued = fast_io.prefetch(files.model_paths(folder, len(models)), load_kwargs, map_location)  # noqa: F841
        for i, model in enumerate(models):
            state_dict = files.read_model(folder, i, model, map_location, into=model.state_dict())
            try:
                state_dict = files.match_wrapper_prefixes(model, state_dict)
                model.load_state_dict(state_dict, strict=strict, **load_model_func_kwargs)
            except RuntimeError as error:
                raise CheckpointError(f"cannot load {files.model_name(i)} into model {i}: {error}") from None
        for i, optimizer in enumerate(optimizers):
            optimizer.load_state_dict(files.read(folder, files.optimizer_name(i), load_kwargs, map_location,
                                                 into=files.optimizer_twin(optimizer)))

    def full_state_dict(self, model: torch.nn.Module, unwrap: bool = True) -> dict:
        """A complete, unsharded state dict for `save_model` / `get_state_dict`. Weights that big-model hooks
        offloaded (to the CPU or disk, meta tensors in the model) are read back from the offload."""
        model = self.unwrap_model(model) if unwrap else model
        from ..big_model.loading import get_state_dict_offloaded_model, has_offloaded_params

        if any(has_offloaded_params(module) for module in model.modules()):
            return get_state_dict_offloaded_model(model)
        return model.state_dict()

    # -- unwrapping -----------------------------------------------------------------------------------------
    def unwrap_model(self, model, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True):
        return unwrap_model(model, keep_fp32_wrapper=keep_fp32_wrapper, keep_torch_compile=keep_torch_compile)
