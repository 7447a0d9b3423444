"""`Accelerator`: the facade a training script talks to. Each method is short and delegates to a room:
state (who am I), backends (how the model is distributed), precision, data_loader, checkpointing, tracking.
"""

from __future__ import annotations

import contextlib
import functools
import os
import warnings
from collections import OrderedDict

import torch

from .backends import create_backend
from .plan import make_run_plan
from .big_model.bnb_params import quantized_model_placement
from .config import accelerator_args
from .config.handlers import (
    AutocastKwargs,
    DataLoaderConfiguration,
    GradientAccumulationPlugin,
    ProfileKwargs,
    ProjectConfiguration,
    TorchDynamoPlugin,
    given_kwargs,
)
from .config.resolve import runtime_value
from .config.settings import refuse_unbuilt_environment
from .core.availability import is_bitsandbytes_multi_backend_available, is_xpu_available
from .core.enums import DistributedType
from .core.errors import ConfigError, NotSupportedYetError
from .distributed import operations
from .parallelism_config import mesh_rank
from .checkpoint import auto_resume
from .resilience import preemption
from .state import AcceleratorState, GradientState, detected_cluster, holds_deepspeed_plugins
from .training.accumulation import AccumulationStep
from .training.lomo import is_lomo_optimizer, lomo_backward
from .training.precision import PrecisionPolicy
from .logging import get_logger

logger = get_logger(__name__)  # Accelerate's module-level logger, at its path
_NOT_PASSED = object()
# The distributed types Accelerate's `multi_device` answers True for: DDP over several accelerators.
_MULTI_DEVICE_TYPES = (DistributedType.MULTI_GPU, DistributedType.MULTI_MLU, DistributedType.MULTI_SDAA,
                       DistributedType.MULTI_MUSA, DistributedType.MULTI_NPU, DistributedType.MULTI_XPU,
                       DistributedType.MULTI_HPU, DistributedType.MULTI_NEURON)


# Accelerate's accelerator module holds its FSDP2 helpers as globals, and scripts patch them there
# (`mock.patch("accelerate.accelerator.fsdp2_prepare_model")`); hasten loads them on first use (FSDP is heavy).
_FSDP2_HELPERS = ("fsdp2_prepare_model", "fsdp2_canonicalize_names")


def __getattr__(name):
    if name in _FSDP2_HELPERS:
        from .backends.fsdp import functions

        return getattr(functions, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _fsdp2_helper(name):
    """The helper this module names now: a patched one if a script patched it here."""
    return globals()[name] if name in globals() else __getattr__(name)


def _is_dataloader(obj) -> bool:
    return isinstance(obj, torch.utils.data.DataLoader)


def _is_scheduler(obj) -> bool:
    return isinstance(obj, torch.optim.lr_scheduler.LRScheduler) or (
        hasattr(obj, "step") and hasattr(obj, "optimizer") and hasattr(obj, "get_last_lr")
        and not isinstance(obj, torch.optim.Optimizer)
    )


class Accelerator:
    """Runs one plain PyTorch training loop on a CPU, one GPU, many GPUs or many machines."""

    def __init__(self, device_placement: bool = True, split_batches=_NOT_PASSED, mixed_precision=None,
                 gradient_accumulation_steps: int = 1, cpu: bool = False,
                 dataloader_config: DataLoaderConfiguration | None = None, deepspeed_plugin=None, fsdp_plugin=None,
                 torch_tp_plugin=None, megatron_lm_plugin=None, rng_types=None, log_with=None, project_dir=None,
                 project_config: ProjectConfiguration | None = None,
                 gradient_accumulation_plugin: GradientAccumulationPlugin | None = None,
                 step_scheduler_with_optimizer: bool = True, kwargs_handlers: list | None = None,
                 dynamo_backend=None, dynamo_plugin: TorchDynamoPlugin | None = None, deepspeed_plugins=None,
                 parallelism_config=None):
        refuse_unbuilt_environment(os.environ)  # e.g. ACCELERATE_USE_MEGATRON_LM=true: refused, not ignored
        if split_batches is not _NOT_PASSED:
            warnings.warn(
                "Accelerator(split_batches=...) is ignored (as in Accelerate); pass "
                "dataloader_config=DataLoaderConfiguration(split_batches=...) instead",
                FutureWarning, stacklevel=2,
            )
        self.project_configuration = project_config if project_config is not None else ProjectConfiguration(project_dir=project_dir)
        if project_dir is not None and self.project_configuration.project_dir is None:
            self.project_configuration.set_directories(project_dir)
        self.dataloader_config = dataloader_config if dataloader_config is not None else DataLoaderConfiguration()
        handlers, self._recipe_handler = accelerator_args.sort_handlers(kwargs_handlers or [])
        self.__dict__.update(handlers)  # ddp_handler, scaler_handler, init_handler, ...
        # A timeout the script passed is honoured even when it equals the dataclass default (600 s): to_kwargs()
        # drops it, as in Accelerate, and the run would then get the collective timeout's own default.
        init_kwargs = given_kwargs(self.init_handler, ("timeout",)) if self.init_handler is not None else {}
        # The run's setup, decided once (hasten/plan/); everything below builds what it names.
        self.run_plan = make_run_plan(
            cluster=detected_cluster(cpu, **init_kwargs), mixed_precision=mixed_precision,
            gradient_accumulation_steps=gradient_accumulation_steps,
            gradient_accumulation_plugin=gradient_accumulation_plugin, deepspeed_plugin=deepspeed_plugin,
            deepspeed_plugins=deepspeed_plugins, fsdp_plugin=fsdp_plugin, torch_tp_plugin=torch_tp_plugin,
            megatron_lm_plugin=megatron_lm_plugin, dynamo_backend=dynamo_backend, dynamo_plugin=dynamo_plugin,
            parallelism_config=parallelism_config, fp8_handler=self._recipe_handler,
            earlier_deepspeed=holds_deepspeed_plugins())
        self.state = AcceleratorState(mixed_precision=mixed_precision, cpu=cpu, _from_accelerator=True,
                                      _run_plan=self.run_plan, **init_kwargs)
        self._build(self.run_plan)
        self.device_placement = device_placement
        self.step_scheduler_with_optimizer = step_scheduler_with_optimizer
        self.rng_types = ["generator"] if rng_types is None else list(rng_types)
        self.log_with = log_with
        self._tracking = None
        if log_with is not None:
            from .tracking import TrackerSession, filter_trackers

            self.log_with = filter_trackers(log_with, self.logging_dir)
            self._tracking = TrackerSession(self.log_with, self.logging_dir)
        # Fault tolerance (docs/fault_tolerance.md): a resume waiting for its objects; the preemption handler.
        self._auto_resume = auto_resume.PendingResume.for_project(self.project_configuration)
        self._preemption = preemption.handler_for(self)

    def _build(self, plan) -> None:
        """Build what the run plan names: the mesh, the precision policy, the backend, the gradient state."""
        if plan.parallelism_config is not None:
            self.state.device_mesh = plan.parallelism_config.get_device_mesh(self.state.device.type)
        precision = PrecisionPolicy.from_setting(plan.precision.trains_in, self.device, self.autocast_handler,
                                                 self.scaler_handler, self._recipe_handler, plan.precision.fp8_engine)
        self._backend = create_backend(plan, self.state, precision=precision, ddp_kwargs=self.ddp_handler)
        # The backend's view of precision: one whose engine applies it (DeepSpeed) keeps hasten's autocast off.
        self.precision = self._backend.precision
        self.scaler = self._backend.make_grad_scaler()
        self.gradient_state = GradientState(gradient_accumulation_plugin=plan.accumulation.plugin)
        self._token_window = None  # token-normalised accumulation (hasten's, opt-in): training/token_accumulation.py
        if plan.accumulation.plugin.normalize_by_tokens:
            from .data.ranks import data_parallel_size
            from .training.token_accumulation import TokenWindow

            self._token_window = TokenWindow(data_parallel_size(self.state), self._backend)
        self.native_amp = self.precision.native_amp
        # Decided once, read on every micro-step: without a scaler or a backend that owns backward, `backward` is
        # `loss.backward()` itself; in one process, `accumulate` has no gradient sync to hold back.
        self._plain_backward = self.scaler is None and self._backend.plain_backward
        self._holds_back_sync = self.use_distributed
        self.fp8_enabled = self.precision.fp8 is not None
        self.has_lomo_optimizer = False
        self.flag_tensor = None
        self.step = 0
        self._models, self._optimizers, self._schedulers, self._dataloaders = [], [], [], []
        self._custom_objects = []
        self._save_model_state_pre_hook = OrderedDict()
        self._load_model_state_pre_hook = OrderedDict()

    # -- who am I -------------------------------------------------------------------------------------------
    device = property(lambda self: self.state.device)
    distributed_type = property(lambda self: self.state.distributed_type)
    num_processes = property(lambda self: self.state.num_processes)
    process_index = property(lambda self: self.state.process_index)
    local_process_index = property(lambda self: self.state.local_process_index)
    is_main_process = property(lambda self: self.state.is_main_process)
    is_local_main_process = property(lambda self: self.state.is_local_main_process)
    is_last_process = property(lambda self: self.state.is_last_process)
    use_distributed = property(lambda self: self.state.use_distributed)
    mixed_precision = property(lambda self: self.state.mixed_precision)
    is_fsdp2 = property(lambda self: self.state.is_fsdp2)
    deepspeed_plugin = property(lambda self: self.state.deepspeed_plugin)
    deepspeed_engine_wrapped = property(lambda self: self._backend.engine_wrapper)
    fp8_backend = property(lambda self: self.precision.fp8_backend)

    @property
    def deepspeed_config(self):
        plugin = self.state.deepspeed_plugin
        if plugin is None:
            raise AttributeError("'Accelerator' object has no attribute 'deepspeed_config' (DeepSpeed is not in use)")
        return plugin.deepspeed_config
    # Accelerate: the local main process without a ParallelismConfig, every process with one (each holds a shard).
    should_save_model = property(lambda self: self.state.is_local_main_process if self.parallelism_config is None
                                 else True)
    parallelism_config = property(lambda self: self.state.parallelism_config)
    torch_device_mesh = property(lambda self: self.state.device_mesh)
    is_composable_parallelism_enabled = property(lambda self: self.state.is_fsdp2)
    tensor_parallel_rank = property(lambda self: mesh_rank(self.state, "tp"))
    context_parallel_rank = property(lambda self: mesh_rank(self.state, "cp"))
    data_parallel_rank = property(lambda self: mesh_rank(self.state, "dp_replicate"))
    data_parallel_shard_rank = property(lambda self: mesh_rank(self.state, "dp_shard"))

    def maybe_context_parallel(self, buffers=None, buffer_seq_dims=None, no_restore_buffers=None):
        from .distributed.context_parallel import maybe_context_parallel

        return maybe_context_parallel(self.state, buffers, buffer_seq_dims, no_restore_buffers)

    @property
    def multi_device(self) -> bool:
        # Accelerate's answer: several accelerator processes under plain DDP (not MULTI_CPU, FSDP, DeepSpeed, XLA).
        return self.use_distributed and self.distributed_type in _MULTI_DEVICE_TYPES

    split_batches = property(lambda self: self.dataloader_config.split_batches)
    dispatch_batches = property(lambda self: self.dataloader_config.dispatch_batches)
    use_seedable_sampler = property(lambda self: self.dataloader_config.use_seedable_sampler)
    non_blocking = property(lambda self: self.dataloader_config.non_blocking)
    use_stateful_dataloader = property(lambda self: self.dataloader_config.use_stateful_dataloader)

    @property
    def even_batches(self) -> bool:
        return self.dataloader_config.even_batches

    @even_batches.setter
    def even_batches(self, value: bool) -> None:
        self.dataloader_config.even_batches = value

    project_dir = property(lambda self: self.project_configuration.project_dir)
    logging_dir = property(lambda self: self.project_configuration.logging_dir)
    save_iteration = property(lambda self: self.project_configuration.iteration)

    @property
    def sync_gradients(self) -> bool:
        return self.gradient_state.sync_gradients

    @sync_gradients.setter
    def sync_gradients(self, value: bool) -> None:
        self.gradient_state.sync_gradients = value

    @property
    def gradient_accumulation_steps(self) -> int:
        return self.gradient_state.num_steps

    @gradient_accumulation_steps.setter
    def gradient_accumulation_steps(self, steps: int) -> None:
        self.gradient_state.plugin_kwargs = {**self.gradient_state.plugin_kwargs, "num_steps": steps}

    @property
    def optimizer_step_was_skipped(self) -> bool:
        return any(opt.step_was_skipped for opt in self._optimizers)

    @property
    def trackers(self) -> list:
        return self._tracking.trackers if self._tracking is not None else []

    # -- prepare --------------------------------------------------------------------------------------------
    def prepare(self, *args, device_placement=None):
        """Wrap each object for this run and return them in the same order (one object comes back bare)."""
        if device_placement is None:
            device_placement = [None] * len(args)
        elif len(device_placement) != len(args):
            raise ConfigError(
                f"device_placement has {len(device_placement)} entries but prepare() got {len(args)} objects"
            )
        for obj in args:
            if isinstance(obj, type) and issubclass(obj, (torch.nn.Module, torch.optim.Optimizer, torch.utils.data.DataLoader)):
                raise TypeError(f"prepare() got the class {obj.__name__}, not an instance: did you forget `()`?")
        if ":" in str(self.project_configuration.project_dir):  # checkpoints to object storage: check it now
            from .checkpoint.remote_checkpoints import check_project_store

            check_project_store(self.project_configuration, self.process_index)
        result = list(args)
        models = [(i, o) for i, o in enumerate(args) if isinstance(o, torch.nn.Module)]
        optimizers = [(i, o) for i, o in enumerate(args) if isinstance(o, torch.optim.Optimizer)]
        self.precision.convert_models([o for _, o in models], [o for _, o in optimizers], fsdp2=self.is_fsdp2)
        self._backend.before_prepare(
            [o for _, o in models], [o for _, o in optimizers], fsdp2_step=self._prepare_fsdp2,
            schedulers=[o for o in args if _is_scheduler(o)], data_loaders=[o for o in args if _is_dataloader(o)],
            split_batches=self.split_batches, accumulation_steps=self.gradient_accumulation_steps,
        )
        # Pass 1: everything but schedulers (they must find their wrapped optimizer in pass 2).
        for i, obj in enumerate(args):
            if not _is_scheduler(obj):
                result[i] = self._prepare_one(obj, device_placement[i])
        for i, obj in enumerate(args):
            if _is_scheduler(obj):
                result[i] = self._prepare_one(obj, device_placement[i])
        result = self._backend.after_prepare(result, list(args), with_models=bool(models))
        self._resume_when_ready()
        return result[0] if len(result) == 1 else tuple(result)

    def _prepare_fsdp2(self, *args):
        """Shard the models among `args` in place (`fsdp2_prepare_model`) and check that every parameter is still
        there by name (`fsdp2_canonicalize_names`), as Accelerate does; the optimizers are re-pointed by the
        backend (`prepare_together`, which `prepare` calls next). Returns `args` with the sharded models."""
        from .backends.fsdp.functions import prepare_fsdp2_objects

        # the helpers are looked up here at call time, so a script's patch of this module's names takes effect
        return prepare_fsdp2_objects(self, args, _fsdp2_helper("fsdp2_prepare_model"),
                                     _fsdp2_helper("fsdp2_canonicalize_names"))

    def _get_named_parameters(self, *args, drop_refs: bool = False) -> dict:
        """{name: parameter} over the models among `args` (unwrapped); with `drop_refs` (Accelerate's keyword) the
        value is the address of the parameter's local data instead of the parameter."""
        from .backends.fsdp.functions import named_parameters_of

        return named_parameters_of(args, drop_refs)

    def _resume_when_ready(self) -> None:
        if self._auto_resume is not None and self._auto_resume.try_load(self):
            self._auto_resume = None

    def _prepare_one(self, obj, device_placement=None):
        # Objects prepared before (here or by another Accelerator) are registered, not wrapped again, by
        # the prepare_* methods, so that save_state still finds them.
        if _is_dataloader(obj):
            return self.prepare_data_loader(obj, device_placement=device_placement)
        if isinstance(obj, torch.nn.Module):
            return self.prepare_model(obj, device_placement=device_placement)
        if isinstance(obj, torch.optim.Optimizer):
            return self.prepare_optimizer(obj, device_placement=device_placement)
        if _is_scheduler(obj):
            return self.prepare_scheduler(obj)
        return obj

    def prepare_model(self, model: torch.nn.Module, device_placement=None, evaluation_mode: bool = False):
        """Move a model to the device, apply mixed precision to its forward, and wrap it for the backend."""
        if getattr(model, "_is_accelerate_prepared", False):
            if model not in self._models:
                self._models.append(model)
            return model
        if device_placement is None:
            device_placement = self.device_placement
        if self.verify_device_map(model):  # dispatched over several devices: its hooks place the weights
            if self.distributed_type != DistributedType.NO and not runtime_value("bypass_device_map").value:
                raise ConfigError("prepare() got a model dispatched with a device map over several devices, which "
                                  "cannot train in a distributed run; launch one process (or set "
                                  "HASTEN_BYPASS_DEVICE_MAP=1)")
            device_placement = False
        # As Accelerate: bitsandbytes trains on the CPU with its multi-backend build, and not on a machine with XPUs.
        # Both probes are looked up here at call time (mock.patch("accelerate.accelerator.is_xpu_available")
        # reaches them) and only for a quantized model on the CPU: the first imports bitsandbytes.
        device_placement = quantized_model_placement(
            model, self.device, self.use_distributed, device_placement,
            bnb_runs_on_cpu=lambda: is_bitsandbytes_multi_backend_available() and not is_xpu_available())
        if any(p.is_meta for p in model.parameters()) and device_placement:
            raise ConfigError("prepare() got a model with parameters on the meta device; load its weights first")
        self._backend.layout_model(model)  # e.g. hasten's Ulysses: attention over the whole sequence
        self.precision.convert_models([model], fsdp2=self.is_fsdp2)
        self.precision.wrap_forward(model)
        model = self._backend.prepare_model(model, device_placement=device_placement, evaluation_mode=evaluation_mode)
        model = self.precision.wrap_prepared(model)
        model = self._backend.compile_model(model)  # torch.compile, last, as the plan's dynamo plugin says
        model._is_accelerate_prepared = True
        self._models.append(model)
        self._resume_when_ready()
        return model

    def prepare_optimizer(self, optimizer, device_placement=None):
        if getattr(optimizer, "_is_accelerate_prepared", False):
            if optimizer not in self._optimizers:
                self._optimizers.append(optimizer)
            return optimizer
        if device_placement is None:
            device_placement = self.device_placement
        self.has_lomo_optimizer |= is_lomo_optimizer(optimizer)
        self.precision.repoint_optimizer(optimizer)
        wrapped = self._backend.prepare_optimizer(optimizer, device_placement=device_placement, scaler=self.scaler)
        self._backend.layout_optimizer(wrapped)  # e.g. Megatron-LM's gradient_clipping before each step
        wrapped._is_accelerate_prepared = True
        self._optimizers.append(wrapped)
        self._resume_when_ready()
        return wrapped

    def prepare_scheduler(self, scheduler):
        if getattr(scheduler, "_is_accelerate_prepared", False):
            if scheduler not in self._schedulers:
                self._schedulers.append(scheduler)
            return scheduler
        # The backend finds the prepared optimizer that owns the scheduler's (or, without one, binds it to them all).
        wrapped = self._backend.prepare_scheduler(scheduler, self._optimizers,
                                                  step_with_optimizer=self.step_scheduler_with_optimizer,
                                                  split_batches=self.split_batches)
        wrapped._is_accelerate_prepared = True
        self._schedulers.append(wrapped)
        self._resume_when_ready()
        return wrapped

    def prepare_data_loader(self, data_loader, device_placement=None, slice_fn_for_dispatch=None):
        from .data_loader import prepare_data_loader

        if getattr(data_loader, "_is_accelerate_prepared", False):
            if data_loader not in self._dataloaders:
                self._dataloaders.append(data_loader)
            return data_loader
        if device_placement is None:
            device_placement = self.device_placement
        config = self.dataloader_config
        prepared = prepare_data_loader(
            data_loader, self.device, num_processes=self.num_processes, process_index=self.process_index,
            split_batches=config.split_batches, put_on_device=device_placement, rng_types=list(self.rng_types),
            dispatch_batches=config.dispatch_batches, even_batches=config.even_batches,
            slice_fn_for_dispatch=slice_fn_for_dispatch, use_seedable_sampler=config.use_seedable_sampler,
            data_seed=config.data_seed, non_blocking=config.non_blocking,
            use_stateful_dataloader=config.use_stateful_dataloader, torch_device_mesh=self.state.device_mesh,
        )
        self._backend.layout_loader(prepared)  # e.g. each sp rank keeps its slice of the sequence
        prepared._is_accelerate_prepared = True
        self._dataloaders.append(prepared)
        self._resume_when_ready()
        return prepared

    def deepspeed_ulysses_dl_adapter(self, dl, model):
        """`UlyssesSPDataLoaderAdapter` around a loader prepared apart from the model (call it after preparing the
        model, as the Trainer does); the loader itself when sp_size is 1."""
        from .backends.deepspeed.ulysses import dl_adapter

        return dl_adapter(self.parallelism_config, dl, model)

    def skip_first_batches(self, dataloader, num_batches: int = 0):
        from .data_loader import skip_first_batches

        return skip_first_batches(dataloader, num_batches=num_batches)

    # -- the training step ----------------------------------------------------------------------------------
    def backward(self, loss, **kwargs):
        """`loss.backward()`, divided by the accumulation steps and scaled for fp16 (with token-normalised
        accumulation: `num_items_in_batch=n`, see hasten/training/token_accumulation.py)."""
        if self._auto_resume is not None:  # training starts before the awaited resume could run
            raise self._auto_resume.missing(self)
        if self._token_window is not None:
            self._token_window.backward(self, loss, kwargs.pop("num_items_in_batch", None), kwargs)
            return
        if "num_items_in_batch" in kwargs:
            raise ConfigError("accelerator.backward(num_items_in_batch=...) is for token-normalised accumulation; fix: "
                              "GradientAccumulationPlugin(normalize_by_tokens=True) or "
                              "--gradient_accumulation_normalize_by_tokens (or drop the argument)")
        steps = self.gradient_state.num_steps
        if self.has_lomo_optimizer and kwargs.get("learning_rate") is not None and self.scaler is None:
            lomo_backward(self._optimizers, loss / steps if steps != 1 else loss, kwargs["learning_rate"])
            return
        if self._plain_backward:  # runs on every micro-step: no call into the backend when it would add nothing
            (loss / steps if steps != 1 else loss).backward(**kwargs)
            return
        self._backend.backward(loss, accumulation_steps=steps, scaler=self.scaler, **kwargs)

    def _do_sync(self) -> None:
        """Decide, once per micro-step, whether this one synchronises gradients; the prepared optimizers and
        schedulers only read the answer (`gradient_state.sync_gradients`)."""
        state = self.gradient_state
        if state._dataloader_references and state.sync_with_dataloader and state.end_of_dataloader:
            self.step = 0
            state.sync_gradients = True
        else:
            self.step += 1
            state.sync_gradients = self.step % state.num_steps == 0

    def accumulate(self, *models):
        """One micro-step: gradients synchronise (and optimizers step) only on the last of each window."""
        return AccumulationStep(self, models)

    def no_sync(self, model):
        """Context in which backward accumulates gradients locally, without all-reducing them."""
        if not self.use_distributed:
            return contextlib.nullcontext()
        return self._backend.no_sync(model)

    def trigger_sync_in_backward(self, model):
        return self._backend.trigger_sync_in_backward(model)

    def autocast(self, autocast_handler: AutocastKwargs | None = None):
        return self.precision.autocast(autocast_handler)

    def unscale_gradients(self, optimizer=None):
        if self.scaler is None:
            return
        optimizers = self._optimizers if optimizer is None else (optimizer if isinstance(optimizer, (list, tuple)) else [optimizer])
        for opt in optimizers:
            self.scaler.unscale_(getattr(opt, "optimizer", opt))

    def clip_grad_norm_(self, parameters, max_norm, norm_type=2):
        """Unscale fp16 gradients, then clip them; returns the total norm.

        Between synchronisation steps with fp16 nothing is done (returns None): unscaling a partial sum
        would corrupt the accumulated gradients and make the next unscale fail.
        """
        if self.scaler is not None and not self.sync_gradients:
            return None
        self.unscale_gradients()
        return self._backend.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)

    def clip_grad_value_(self, parameters, clip_value):
        if not self._backend.supports_clip_grad_value:
            raise NotSupportedYetError(f"clip_grad_value_ is not available with the {self._backend.name} backend; use clip_grad_norm_")
        if self.scaler is not None and not self.sync_gradients:
            return None
        self.unscale_gradients()
        self._backend.clip_grad_value_(parameters, clip_value)

    # -- collectives and process control --------------------------------------------------------------------
    def gather(self, tensor):
        return operations.gather(tensor)

    def gather_for_metrics(self, input_data, use_gather_object: bool = False):
        from .data.metrics import gather_for_metrics

        return gather_for_metrics(input_data, use_gather_object=use_gather_object)

    def reduce(self, tensor, reduction: str = "sum", scale: float = 1.0):
        return operations.reduce(tensor, reduction=reduction, scale=scale)

    def pad_across_processes(self, tensor, dim: int = 0, pad_index: int = 0, pad_first: bool = False):
        return operations.pad_across_processes(tensor, dim=dim, pad_index=pad_index, pad_first=pad_first)

    def wait_for_everyone(self):
        self.state.wait_for_everyone()

    def main_process_first(self):
        return self.state.main_process_first()

    def local_main_process_first(self):
        return self.state.local_main_process_first()

    def split_between_processes(self, inputs, apply_padding: bool = False):
        return self.state.split_between_processes(inputs, apply_padding=apply_padding)

    def print(self, *args, **kwargs):
        self.state.print(*args, **kwargs)

    def _run_if(self, selected, function):
        """Decorator whose target process is decided at call time; other processes get None."""
        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            if selected() or not self.use_distributed:
                return function(*args, **kwargs)
            return None

        return wrapper

    def on_main_process(self, function=None):
        return self._run_if(lambda: self.is_main_process, function)

    def on_local_main_process(self, function=None):
        return self._run_if(lambda: self.is_local_main_process, function)

    def on_last_process(self, function=None):
        return self._run_if(lambda: self.is_last_process, function)

    def on_process(self, function=None, process_index=None):
        if function is None:
            return functools.partial(self.on_process, process_index=process_index)
        return self._run_if(lambda: self.process_index == process_index, function)

    def on_local_process(self, function=None, local_process_index=None):
        if function is None:
            return functools.partial(self.on_local_process, local_process_index=local_process_index)
        return self._run_if(lambda: self.local_process_index == local_process_index, function)

    def join_uneven_inputs(self, joinables, even_batches=None):
        """Let processes with fewer batches finish early (DDP on several devices or CPU processes; a no-op
        elsewhere, with Accelerate's warning)."""
        from .data.join import join_uneven_inputs

        return join_uneven_inputs(self, joinables, even_batches)

    def set_trigger(self):
        self.flag_tensor = torch.tensor(1, device=self.device)

    def check_trigger(self) -> bool:
        if self.flag_tensor is None:
            self.flag_tensor = torch.tensor(0, device=self.device)
        fired = bool(self.reduce(self.flag_tensor, reduction="sum").item() >= 1)
        if fired:
            self.flag_tensor = torch.tensor(0, device=self.device)
        return fired

    # -- models ---------------------------------------------------------------------------------------------
    def unwrap_model(self, model, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True):
        return self._backend.unwrap_model(model, keep_fp32_wrapper=keep_fp32_wrapper, keep_torch_compile=keep_torch_compile)

    def get_state_dict(self, model, unwrap: bool = True) -> dict:
        return self._backend.full_state_dict(model, unwrap=unwrap)

    def verify_device_map(self, model) -> bool:
        return any(len(getattr(m, "hf_device_map", {}) or {}) > 1 for m in model.modules())

    def free_memory(self, *objects):
        from .training.memory import release_memory

        self._backend.free_memory()
        self._models, self._optimizers, self._schedulers, self._dataloaders = [], [], [], []
        self.step = 0
        return release_memory(*objects)

    clear = free_memory

    def profile(self, profile_handler: ProfileKwargs | None = None):
        from .observe.profiling import profile

        return profile(self, profile_handler)

    def track_memory(self, output_dir=None, interval: float = 0.5, plot: bool = True):
        """A hasten extension: a `MemoryTracker` sampling this process's memory (see docs/observability.md)."""
        from .observe.memory_tracker import track_memory

        return track_memory(self, output_dir, interval=interval, plot=plot)

    def track_step_times(self, log_every: int = 10, straggler_factor: float = 1.5, synchronize: bool = False):
        """A hasten extension: log where each step's time goes, and the straggler rank (see docs/observability.md)."""
        from .observe.step_timer import track_step_times

        return track_step_times(self, log_every, straggler_factor=straggler_factor, synchronize=synchronize)

    # -- checkpoints (hasten/checkpoint/layout.py) --------------------------------------------------------------
    def _checkpoint_contents(self, loader_positions: bool = False):
        """What `save_state` writes and `load_state` restores: every object this Accelerator holds right now."""
        from .checkpoint.layout import CheckpointContents

        return CheckpointContents(
            loader_positions=loader_positions,
            backend=self._backend, state=self.state, project=self.project_configuration,
            models=list(self._models), optimizers=list(self._optimizers), schedulers=list(self._schedulers),
            dataloaders=list(self._dataloaders), custom_objects=list(self._custom_objects), scaler=self.scaler,
            step=self.step, save_hooks=list(self._save_model_state_pre_hook.values()),
            load_hooks=list(self._load_model_state_pre_hook.values()),
        )

    def save_state(self, output_dir=None, safe_serialization: bool = True, async_save: bool = False,
                   **save_model_func_kwargs):
        from .checkpoint import layout

        return layout.save_state(self._checkpoint_contents(), output_dir, safe_serialization=safe_serialization,
                                        async_save=async_save, **save_model_func_kwargs)

    def wait_for_checkpoint(self):
        """hasten only: block until an asynchronous `save_state` is committed; raise what went wrong in it."""
        from .checkpoint.async_save import wait

        wait()

    def load_state(self, input_dir=None, load_kwargs=None, **load_model_func_kwargs):
        self._load_state(input_dir, load_kwargs, loader_positions=False, **load_model_func_kwargs)

    def _load_state(self, input_dir=None, load_kwargs=None, *, loader_positions: bool, **load_model_func_kwargs):
        """`load_state`; `loader_positions=True` also moves plain prepared loaders to their saved position
        (automatic resume; a script's load_state does not, as in Accelerate: see docs/checkpointing.md)."""
        from .checkpoint import layout

        self._auto_resume = None  # an explicit load replaces the automatic one
        step = layout.load_state(self._checkpoint_contents(loader_positions), input_dir, load_kwargs=load_kwargs,
                                        **load_model_func_kwargs)
        if step is not None:
            self.step = step

    def save_model(self, model, save_directory, max_shard_size="10GB", safe_serialization: bool = True):
        from .checkpoint import layout

        return layout.save_model(self._checkpoint_contents(), model, save_directory,
                                        max_shard_size=max_shard_size, safe_serialization=safe_serialization)

    def save(self, obj, f, safe_serialization: bool = False):
        from .utils.other import save

        save(obj, f, save_on_each_node=self.project_configuration.save_on_each_node, safe_serialization=safe_serialization)

    def register_for_checkpointing(self, *objects):
        invalid = [(index, type(o).__name__) for index, o in enumerate(objects)
                   if not (hasattr(o, "state_dict") and hasattr(o, "load_state_dict"))]
        if invalid:
            # Accelerate's words first (code matches "Item at index N"); N is the argument's position
            raise ConfigError(
                "All `objects` must include a `state_dict` and `load_state_dict` function to be stored. The following "
                "inputs are invalid:" + "".join(f"\n\t- Item at index {index}, `{name}`" for index, name in invalid)
                + "\nregister_for_checkpointing saves each object through those two methods; wrap the others in an "
                "object that has them"
            )
        self._custom_objects.extend(objects)
        self._resume_when_ready()

    def register_save_state_pre_hook(self, hook):
        from torch.utils.hooks import RemovableHandle

        handle = RemovableHandle(self._save_model_state_pre_hook)
        self._save_model_state_pre_hook[handle.id] = hook
        return handle

    def register_load_state_pre_hook(self, hook):
        from torch.utils.hooks import RemovableHandle

        handle = RemovableHandle(self._load_model_state_pre_hook)
        self._load_model_state_pre_hook[handle.id] = hook
        return handle

    # -- experiment tracking (hasten/tracking/) -------------------------------------------------------------
    def _tracker_session(self):
        if self._tracking is None:
            from .tracking import TrackerSession

            self._tracking = TrackerSession([], self.logging_dir)
        return self._tracking

    def init_trackers(self, project_name: str, config: dict | None = None, init_kwargs: dict | None = None):
        self._tracker_session().start(project_name, config, init_kwargs)

    def log(self, values: dict, step: int | None = None, log_kwargs: dict | None = None):
        self._tracker_session().log(values, step, log_kwargs)

    def get_tracker(self, name: str, unwrap: bool = False):
        return self._tracker_session().get(name, unwrap)

    def end_training(self):
        from .checkpoint.async_save import close

        close()  # an asynchronous save commits before the process group goes
        if self._tracking is not None:
            self._tracking.finish()
        self.state.destroy_process_group()

    def __deepcopy__(self, memo):
        return self

