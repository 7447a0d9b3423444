"""DeepSpeed ZeRO (stages 0-3) as a backend: the engine owns backward, the optimizer step, accumulation,
clipping and its checkpoint files.

Processes, ranks and data sharding come from hasten's own state (torch.distributed, joined before DeepSpeed
is imported); DeepSpeed wraps that process group instead of starting its own. So every rank knows it is
one of N and reads 1/N of the data — the case Accelerate 1.15 gets wrong on CPU (see docs/deepspeed.md).

`prepare(model, optimizer, loader, scheduler)` builds one engine per call: the `"auto"` values of the active
plugin's config are filled from what the call sees (`config/deepspeed.py` says which source wins), then
`deepspeed.initialize` runs once and `prepare_model` / `wrap_optimizer` / `wrap_scheduler` hand out its parts.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import warnings

import torch
import torch.distributed as dist
from torch.utils.weak import WeakIdKeyDictionary

from . import ulysses
from .dummies import DummyOptim, DummyScheduler
from ...checkpoint.storage import paths
from ...config.deepspeed import AUTO, _walk, get_active_deepspeed_plugin
from ...core.errors import CheckpointError, ConfigError, NotBuiltError
from ...distributed.bootstrap import collective_timeout
from ...optimizer import inner_optimizer
from ...state import GradientState
from ..base import Backend
from .wrappers import DeepSpeedEngineWrapper, DeepSpeedOptimizerWrapper, DeepSpeedSchedulerWrapper

INSTALL_HINT = 'DeepSpeed is not installed: pip install "hasten[deepspeed]"'
MODEL_TAG = "pytorch_model"
# DeepSpeed optimizer types that on a CPU need a C++ op compiled on first use (minutes), or do not exist there.
_CPU_JIT_OPTIMIZERS = {"adam": "fused_adam", "adamw": "fused_adam"}
_CPU_MISSING_OPTIMIZERS = ("lamb", "lion", "onebitadam", "zerooneadam", "onebitlamb")
_ALLOW_JIT_VARIABLE = "HASTEN_DEEPSPEED_ALLOW_JIT"


def import_deepspeed(device_type: str):
    """`import deepspeed` for this run's device (DeepSpeed picks its accelerator once, at import)."""
    if device_type == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    try:
        import deepspeed
    except ImportError:
        raise ImportError(INSTALL_HINT) from None
    from deepspeed.accelerator import get_accelerator

    name = get_accelerator().device_name()
    if device_type == "cpu" and name != "cpu" or device_type != "cpu" and name == "cpu":
        raise ConfigError(
            f"DeepSpeed was imported for device {name!r} but this run uses {device_type!r}; set DS_ACCELERATOR="
            f"{'cpu' if device_type == 'cpu' else device_type} before anything imports deepspeed"
        )
    return deepspeed


def _ensure_process_group(state) -> None:
    """DeepSpeed needs a process group; a plain `python train.py` gets a one-process one (no MPI lookup)."""
    if dist.is_initialized():
        return
    from ...distributed.bootstrap import init_single_process_group

    init_single_process_group()
    for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
        os.environ.setdefault(name, value)


class DeepSpeedBackend(Backend):
    name = "deepspeed"
    supports_clip_grad_value = False
    regional_compilation_in_place = True  # as Accelerate (compile_regions_deepspeed on the engine's module)

    def __init__(self, state, plan, precision=None, ddp_kwargs=None):
        super().__init__(state, plan, precision=precision, ddp_kwargs=ddp_kwargs)
        # The engine casts the model and scales fp16 losses itself (the config's fp16/bf16 sections, which the
        # plugins got from the mixed_precision setting): hasten's autocast and loss scaler stay off; the rest of the
        # run plan's precision (its fp8 recipe and engine) stays.
        self.precision = self.precision.applied_by_engine()
        self._wrappers: list = []  # one DeepSpeedEngineWrapper per engine, in prepare order
        self._engine_of = WeakIdKeyDictionary()  # the user's model -> its engine
        self._pending = None  # what the current prepare() call built: consumed by prepare_model & co.
        if any(p.dschf is not None and p.hf_ds_config.is_zero3() for p in plan.deepspeed_plugins.values()):
            # transformers may build a model partitioned (zero.Init) before prepare(): DeepSpeed's view of the
            # processes must exist by then, or zero.Init counts one process.
            self._start_deepspeed()

    # -- checks that must come before DeepSpeed crashes -----------------------------------------------------
    def _check_device(self, plugin, config: dict) -> dict:
        """At prepare, where DeepSpeed would start: a GPU configuration (fp16, CPU offload) still loads on a CPU
        machine, as in Accelerate, and is refused only when it cannot run there. Returns the config to hand
        DeepSpeed: on a CPU run without its CPU offload sections (the state is in CPU memory already), which
        DeepSpeed would otherwise serve only with its JIT-compiled CPU optimizers; the plugin's config is kept."""
        if self.state.device.type != "cpu":
            return config
        if plugin.mixed_precision == "fp16":
            raise ConfigError(
                "DeepSpeed cannot train in fp16 on a CPU (its CPU accelerator has no fp16 support); use "
                "mixed_precision='bf16' or 'no', or disable the DeepSpeed config's fp16 section"
            )
        offloaded = [what for what in ("optimizer", "param")
                     if plugin.get_value(f"zero_optimization.offload_{what}.device") == "cpu"]
        if not offloaded:
            return config
        from ...config.resolve import strict

        names = " and ".join(f"offload_{what}_device 'cpu'" for what in offloaded)
        if strict():
            raise ConfigError(
                f"DeepSpeed {names} moves state to CPU memory, but this run already trains on the CPU; set it to "
                "'none' (an error under hasten's strict setting)"
            )
        warnings.warn(f"DeepSpeed {names}: this run trains on the CPU, where the state already is, so hasten hands "
                      f"DeepSpeed the config without {' and '.join(f'offload_{w}' for w in offloaded)} (nothing "
                      "changes on a CPU; on a GPU run it offloads)", stacklevel=2)
        zero = {key: value for key, value in config["zero_optimization"].items()
                if key not in {f"offload_{what}" for what in offloaded}}
        return {**config, "zero_optimization": zero}

    def _check_cpu_optimizer(self, config: dict) -> None:
        """A config optimizer that on a CPU needs a JIT-compiled DeepSpeed op: refuse unless it is built or allowed."""
        if self.state.device.type != "cpu" or not isinstance(config.get("optimizer"), dict):
            return
        kind = str(config["optimizer"].get("type", "")).lower()
        params = config["optimizer"].get("params") or {}
        hint = 'set "torch_adam": true in the config\'s optimizer.params to use torch.optim.Adam(W)'
        if kind in _CPU_MISSING_OPTIMIZERS:
            raise ConfigError(f"DeepSpeed optimizer {kind!r} has no CPU implementation; use AdamW and {hint}")
        op = _CPU_JIT_OPTIMIZERS.get(kind)
        if op is None or (kind in ("adam", "adamw") and params.get("torch_adam")):
            return
        from ...config.resolve import runtime_value

        allowed = runtime_value("deepspeed_allow_jit").value  # HASTEN_DEEPSPEED_ALLOW_JIT, checked by the table
        if allowed or _op_is_built(op):
            return
        raise ConfigError(
            f"DeepSpeed optimizer {kind!r} on a CPU needs the C++ op {op!r}, compiled on first use (4-5 minutes, not "
            f"built yet); {hint}, or set {_ALLOW_JIT_VARIABLE}=1 to compile it"
        )

    # -- preparing ------------------------------------------------------------------------------------------
    def prepare_together(self, models, optimizers, schedulers=(), data_loaders=(), split_batches=False,
                         accumulation_steps=1, **_):
        models = [m for m in models if m not in self._engine_of and not getattr(m, "_is_accelerate_prepared", False)]
        if not models:
            if optimizers or [s for s in schedulers if not getattr(s, "_is_accelerate_prepared", False)]:
                raise ConfigError(
                    "under DeepSpeed, pass the optimizer and scheduler to the same prepare() call as their model"
                )
            return
        if len(models) > 1:
            raise ConfigError(
                "under DeepSpeed one prepare() call takes one model; prepare each model in its own call (select its "
                "plugin first with accelerator.state.select_deepspeed_plugin(name))"
            )
        if len(optimizers) > 1 or len(schedulers) > 1:
            raise ConfigError("under DeepSpeed one prepare() call takes at most one optimizer and one scheduler")
        model = models[0]
        optimizer = optimizers[0] if optimizers else None
        scheduler = schedulers[0] if schedulers else None
        plugin = get_active_deepspeed_plugin(self.plan)
        plugin.check_usable()
        config = self._fill_config(plugin, model, optimizer, scheduler, data_loaders, split_batches, accumulation_steps)
        config = self._check_device(plugin, config)
        refuse_autotp(config)
        self._check_cpu_optimizer(config)
        self._pending = self._initialize(plugin, config, model, optimizer, scheduler)

    def _fill_config(self, plugin, model, optimizer, scheduler, data_loaders, split_batches, steps) -> dict:
        """Fill the plugin's "auto" values from this prepare() call; conflicting numbers are errors."""
        num_processes = self.state.num_processes
        values, sources, given = {}, {}, {}  # given: values the user chose, which must agree with the config

        def put(key, value, source, user_given=False):
            (given if user_given else values)[key], sources[key] = value, source

        sizes = [loader.batch_size for loader in data_loaders]
        if sizes:
            if any(size is None for size in sizes):
                raise ConfigError(
                    "a DataLoader passed to prepare() has batch_size=None (a batch_sampler?); set "
                    "train_micro_batch_size_per_gpu in the DeepSpeed config"
                )
            if split_batches:
                sizes = [size // num_processes for size in sizes]
            micro = min(sizes) if plugin.is_train_batch_min else max(sizes)
            put("train_micro_batch_size_per_gpu", micro, f"the DataLoader's batch_size given to prepare() ({micro})",
                user_given=True)
        elif plugin.is_auto("train_micro_batch_size_per_gpu"):
            raise ConfigError(
                "DeepSpeed needs the micro-batch size: pass the training DataLoader to the same prepare() call as "
                "the model, or set train_micro_batch_size_per_gpu in the DeepSpeed config"
            )
        put("gradient_accumulation_steps", steps, "the Accelerator's gradient_accumulation_steps", user_given=True)
        put("gradient_clipping", 1.0, 'the default for "auto" (1.0, as in Accelerate)')
        put("zero_optimization.stage3_gather_16bit_weights_on_model_save", False, 'the default for "auto"')
        self._hidden_size_values(plugin, model, put)
        self._optimizer_values(plugin, optimizer, scheduler, num_processes, split_batches, put)
        plugin.fill_auto(given, sources)
        plugin.fill_auto(values, sources, must_match=False)
        micro = plugin.get_value("train_micro_batch_size_per_gpu")
        # sp ranks share their batches (Accelerate)
        num_processes = ulysses.data_parallel_processes(self.state.num_processes, self.plan.parallelism_config)
        total = micro * plugin.get_value("gradient_accumulation_steps") * num_processes
        plugin.fill_auto({"train_batch_size": total}, "micro-batch x accumulation steps x processes")
        if plugin.get_value("train_batch_size", total) != total:
            raise ConfigError(
                f"DeepSpeed train_batch_size is {plugin.get_value('train_batch_size')} in "
                f"{plugin.source_of('train_batch_size')} but micro-batch {micro} x accumulation steps "
                f"{plugin.get_value('gradient_accumulation_steps')} x {num_processes} processes = {total}; fix one of them"
            )
        leftover = [key for key, value in _walk(plugin.deepspeed_config) if value == AUTO]
        if leftover:
            raise ConfigError(
                f'DeepSpeed config value(s) {", ".join(leftover)} are "auto" but nothing in prepare() fills them; '
                "set numbers in the config"
            )
        plugin.hf_ds_config.set_stage_and_offload()
        return plugin.deepspeed_config

    @staticmethod
    def _hidden_size_values(plugin, model, put) -> None:
        keys = ("zero_optimization.reduce_bucket_size", "zero_optimization.stage3_prefetch_bucket_size",
                "zero_optimization.stage3_param_persistence_threshold")
        autos = [key for key in keys if plugin.is_auto(key)]
        if not autos:
            return
        config = getattr(model, "config", None)
        hidden = getattr(config, "hidden_size", None)
        if hidden is None and getattr(config, "hidden_sizes", None):
            hidden = max(config.hidden_sizes)
        if hidden is None:
            # Accelerate's words first (scripts match them), then which values need it
            start = ("Can't find `model.config` entry" if config is None else
                     "Can find neither `model.config.hidden_size` nor `model.config.hidden_sizes`")
            raise ConfigError(
                f'{start}, which fills the "auto" DeepSpeed config value(s) {", ".join(autos)}; set numbers there'
            )
        source = f"model.config.hidden_size ({hidden})"
        put(keys[0], hidden * hidden, source)
        put(keys[1], int(0.9 * hidden * hidden), source)
        put(keys[2], 10 * hidden, source)

    @staticmethod
    def _optimizer_values(plugin, optimizer, scheduler, num_processes, split_batches, put) -> None:
        config = plugin.deepspeed_config
        optimizer = inner_optimizer(optimizer) if optimizer is not None else None
        if optimizer is not None:
            if "optimizer" in config and not isinstance(optimizer, DummyOptim):
                raise ConfigError(
                    "the DeepSpeed config has an \"optimizer\" section and prepare() got a torch optimizer; remove "
                    "one of them (use hasten.utils.DummyOptim in code to keep the config's)"
                )
            if "optimizer" not in config and isinstance(optimizer, DummyOptim):
                raise ConfigError("DummyOptim needs an \"optimizer\" section in the DeepSpeed config")
            if not isinstance(optimizer, DummyOptim):
                config["zero_allow_untested_optimizer"] = True
            else:
                put("optimizer.params.lr", optimizer.lr, f"DummyOptim(lr={optimizer.lr})")
                put("optimizer.params.weight_decay", optimizer.weight_decay,
                    f"DummyOptim(weight_decay={optimizer.weight_decay})")
        if scheduler is None:
            return
        if "scheduler" in config and not isinstance(scheduler, DummyScheduler):
            raise ConfigError(
                "the DeepSpeed config has a \"scheduler\" section and prepare() got a scheduler; remove one of them "
                "(use hasten.utils.DummyScheduler in code to keep the config's)"
            )
        if isinstance(scheduler, DummyScheduler):
            if "scheduler" not in config and scheduler.lr_scheduler_callable is None:
                raise ConfigError(
                    "DummyScheduler needs a \"scheduler\" section in the DeepSpeed config or lr_scheduler_callable"
                )
            if not isinstance(optimizer, DummyOptim) and optimizer is not None:
                raise ConfigError("DummyScheduler goes with DummyOptim; with a torch optimizer pass a torch scheduler")
            if scheduler.lr_scheduler_callable is None:
                lr = inner_optimizer(scheduler.optimizer).defaults["lr"]
                put("scheduler.params.warmup_min_lr", 0, "the default for \"auto\" (0)")
                put("scheduler.params.warmup_max_lr", lr, f"the optimizer's lr ({lr})")
                put("scheduler.params.warmup_num_steps", max(1, scheduler.warmup_num_steps), "DummyScheduler")
                if scheduler.total_num_steps is not None:
                    total = scheduler.total_num_steps if split_batches else math.ceil(scheduler.total_num_steps / num_processes)
                    put("scheduler.params.total_num_steps", total, "DummyScheduler(total_num_steps / processes)")
        elif isinstance(optimizer, DummyOptim):
            raise ConfigError("DummyOptim goes with DummyScheduler (or no scheduler), not a torch scheduler")

    def _start_deepspeed(self):
        """Import deepspeed and let it wrap hasten's process group (it starts none of its own)."""
        deepspeed = import_deepspeed(self.state.device.type)
        _ensure_process_group(self.state)
        # The one collective timeout (InitProcessGroupKwargs(timeout=) / HASTEN_COLLECTIVE_TIMEOUT) for the groups
        # DeepSpeed makes too; hasten's own group already has it.
        deepspeed.init_distributed(dist_backend=dist.get_backend(), auto_mpi_discovery=False, verbose=False,
                                   timeout=collective_timeout(getattr(self.state, "collective_timeout", None)))
        return deepspeed

    def _initialize(self, plugin, config, model, optimizer, scheduler) -> dict:
        deepspeed = self._start_deepspeed()
        plugin.set_moe_leaf_modules(model)
        kwargs = {"model": model, "config": config}
        ds_scheduler = None
        if optimizer is not None:
            inner = inner_optimizer(optimizer)
            if isinstance(inner, DummyOptim):
                kwargs["model_parameters"] = inner.param_groups
                if isinstance(scheduler, DummyScheduler) and scheduler.lr_scheduler_callable is not None:
                    kwargs["lr_scheduler"] = scheduler.lr_scheduler_callable
            else:
                offloads = config["zero_optimization"].get("offload_optimizer", {}).get("device", "none") != "none"
                if offloads and config.get("zero_force_ds_cpu_optimizer", True):
                    inner = map_pytorch_optim_to_deepspeed(inner)  # ZeRO-Offload steps on the CPU
                kwargs["optimizer"] = inner
                if scheduler is not None and type(scheduler).__name__ in _valid_ds_schedules():
                    kwargs["lr_scheduler"] = ds_scheduler = scheduler
        if isinstance(scheduler, DummyScheduler):
            ds_scheduler = scheduler
        self.ulysses_mpu = None
        if ulysses.layout(self.plan.parallelism_config) is not None:  # Accelerate's sp_size: DeepSpeed's groups
            kwargs["mpu"] = self.ulysses_mpu = ulysses.register(self.plan.parallelism_config, model,
                                                                plugin.get_value("train_micro_batch_size_per_gpu"))
        engine, ds_optimizer, _, lr_scheduler = deepspeed.initialize(**kwargs)
        wrapper = DeepSpeedEngineWrapper(engine)
        if ds_optimizer is not None:
            self._wrappers.append(wrapper)
        self._engine_of[model] = engine
        return {"model": model, "engine": engine, "optimizer": optimizer, "ds_optimizer": ds_optimizer,
                "scheduler": scheduler, "ds_scheduler": ds_scheduler, "lr_scheduler": lr_scheduler, "wrapper": wrapper}

    def prepare_model(self, model, device_placement, evaluation_mode):
        if model in self._engine_of:
            return self._engine_of[model]
        # A model prepared without a DataLoader or optimizer (e.g. a frozen reference model): an engine too.
        self.prepare_together([model], [])
        return self._engine_of[model]

    def prepare_optimizer(self, optimizer, device_placement=True, scaler=None):
        pending = self._pending
        if pending is None or pending["optimizer"] is not optimizer:
            raise ConfigError("under DeepSpeed, pass the optimizer to the same prepare() call as its model")
        wrapped = DeepSpeedOptimizerWrapper(pending["ds_optimizer"])
        pending["wrapped_optimizer"] = wrapped
        return wrapped

    def prepare_scheduler(self, scheduler, optimizers, step_with_optimizer=True, split_batches=False):
        pending = self._pending
        if pending is None or pending["scheduler"] is not scheduler:
            return super().prepare_scheduler(scheduler, optimizers, step_with_optimizer, split_batches)
        owner = [pending["wrapped_optimizer"]] if "wrapped_optimizer" in pending else []
        if pending["ds_scheduler"] is not None:
            return DeepSpeedSchedulerWrapper(pending["lr_scheduler"], owner)
        from ...scheduler import AcceleratedScheduler

        return AcceleratedScheduler(scheduler, owner, step_with_optimizer=step_with_optimizer, split_batches=split_batches)

    # -- the training step ----------------------------------------------------------------------------------
    @property
    def engine_wrapper(self):
        """The engine `accelerator.backward` drives (the last one prepared with an optimizer), as in Accelerate."""
        return self._wrappers[-1] if self._wrappers else None

    def _wrapper_for_loss(self, loss):
        if len(self._wrappers) == 1:
            return self._wrappers[0]
        if not self._wrappers:
            raise ConfigError("accelerator.backward() under DeepSpeed needs a model prepared with an optimizer")
        owners = _engines_in_graph(loss, {id(w.engine): w for w in self._wrappers},
                                   {id(p): id(w.engine) for w in self._wrappers for p in w.engine.module.parameters()})
        if len(owners) != 1:
            raise ConfigError(
                f"this loss flows into {len(owners)} DeepSpeed models; accelerator.backward() needs a loss of exactly "
                "one prepared model (compute one loss per model)"
            )
        return owners[0]

    def backward(self, loss, accumulation_steps=1, scaler=None, **kwargs):
        # The engine divides by its gradient_accumulation_steps itself (the same number: prepare filled it).
        self._wrapper_for_loss(loss).backward(loss, sync_gradients=GradientState().sync_gradients, **kwargs)

    def _wrapper_for_parameters(self, parameters):
        if len(self._wrappers) == 1:
            return self._wrappers[0]
        first = next(iter(parameters), None)
        for wrapper in self._wrappers:
            if any(p is first for p in wrapper.engine.module.parameters()):
                return wrapper
        raise ConfigError("clip_grad_norm_ got parameters of no prepared DeepSpeed model")

    def clip_grad_norm_(self, parameters, max_norm, norm_type=2.0):
        """DeepSpeed clips inside its step at the config's gradient_clipping; return the norm it measured."""
        parameters = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        wrapper = self._wrapper_for_parameters(parameters)
        engine = wrapper.engine
        configured = engine.gradient_clipping()
        if float(norm_type) != 2.0:
            raise ConfigError(f"DeepSpeed clips by the 2-norm; clip_grad_norm_(norm_type={norm_type}) cannot be honoured")
        if not math.isclose(float(max_norm), float(configured or 0.0)):
            plugin = get_active_deepspeed_plugin(self.plan)
            raise ConfigError(
                f"DeepSpeed clips inside its step at gradient_clipping={configured} (from "
                f"{plugin.source_of('gradient_clipping')}) but clip_grad_norm_ asked for max_norm={max_norm}; set "
                f"DeepSpeedPlugin(gradient_clipping={max_norm}) or gradient_clipping in the DeepSpeed config"
            )
        return wrapper.get_global_grad_norm()

    # -- checkpoints ----------------------------------------------------------------------------------------
    def _engines(self, models) -> list:
        return [m if _is_engine(m) else self._engine_of.get(m) for m in models]

    def check_save_kwargs(self, save_model_func_kwargs: dict) -> None:
        """Any keywords: they go to each engine's `save_checkpoint` (client_state, exclude_frozen_parameters...)."""
        if not GradientState().sync_gradients:
            raise CheckpointError(
                "save_state() in the middle of a gradient accumulation window: DeepSpeed's checkpoint does not hold "
                "the partial gradient sum; save after a step where accelerator.sync_gradients is True"
            )

    def save_model_and_optimizer(self, folder, models, optimizers, *, writer=True, rank=0, safe_serialization=True,
                                 before_write=None, **save_model_func_kwargs) -> list:
        """Each engine writes DeepSpeed's own checkpoint (tags `pytorch_model`, `pytorch_model_1`, ...: module,
        optimizer and DeepSpeed scheduler state, every process its shards) into `folder`, hasten's temporary folder
        that the caller commits whole. Returns the names this process wrote."""
        if before_write is not None:
            before_write([])  # the engines write their own files: no state dicts for pre-hooks to change
        names = []
        for i, engine in enumerate(self._engines(models)):
            tag = MODEL_TAG if i == 0 else f"{MODEL_TAG}_{i}"
            engine.save_checkpoint(folder, tag=tag, **save_model_func_kwargs)
            names.append(tag)
        if dist.get_rank() == 0:  # DeepSpeed's `latest` file and zero_to_fp32.py
            names += [n for n in paths.files_in(folder) if n not in names]
        return names

    def load_model_and_optimizer(self, folder, models, optimizers, *, map_location="cpu", load_kwargs=None,
                                 strict=True, **load_model_func_kwargs) -> None:
        load_model_func_kwargs.setdefault("load_module_strict", strict)
        for i, engine in enumerate(self._engines(models)):
            tag = MODEL_TAG if i == 0 else f"{MODEL_TAG}_{i}"
            if not paths.is_dir(os.path.join(folder, tag)):
                raise CheckpointError(f"{folder} holds no DeepSpeed checkpoint {tag!r} for model {i}")
            path, _ = engine.load_checkpoint(folder, tag=tag, **load_model_func_kwargs)
            if path is None:
                raise CheckpointError(f"DeepSpeed could not load checkpoint {tag!r} from {folder}")

    def full_state_dict(self, model, unwrap=True):
        engine = model if _is_engine(model) else self._engine_of.get(model)
        if engine is None:
            return super().full_state_dict(model, unwrap=unwrap)
        if engine.zero_optimization_partition_weights():
            # ZeRO-3: gather one layer at a time; rank 0 receives the whole state dict, the others None.
            return engine._zero3_consolidated_16bit_state_dict()
        return (engine.module if unwrap else engine).state_dict()

    def unwrap_model(self, model, keep_fp32_wrapper=True, keep_torch_compile=True):
        if _is_engine(model):
            model = model.module
        return super().unwrap_model(model, keep_fp32_wrapper=keep_fp32_wrapper, keep_torch_compile=keep_torch_compile)

    def free_memory(self) -> None:
        for wrapper in self._wrappers:
            with contextlib.suppress(Exception):
                wrapper.engine.destroy()
        self._wrappers.clear()
        self._pending = None


def refuse_autotp(config: dict) -> None:
    """DeepSpeed's AutoTP (`tensor_parallel.autotp_size` above 1 in the config) also needs data loaders that treat
    each tensor-parallel group as one data rank; hasten builds neither yet, and DeepSpeed given only the key would
    feed every rank of a group different batches, so the key is refused where the config is handed over."""
    block = config.get("tensor_parallel") or {}
    size = block.get("autotp_size", 1) if isinstance(block, dict) else block
    if size not in (None, 0, 1):
        raise NotBuiltError(f"DeepSpeed AutoTP (tensor_parallel.autotp_size={size} in the DeepSpeed config) is not "
                            "built in hasten; fix: remove the tensor_parallel block, or use ParallelismConfig(tp_size=...)")


def _is_engine(model) -> bool:
    engine_module = sys.modules.get("deepspeed.runtime.engine")  # not imported: no engine exists
    return engine_module is not None and isinstance(model, engine_module.DeepSpeedEngine)


def _valid_ds_schedules():
    from deepspeed.runtime.lr_schedules import VALID_LR_SCHEDULES

    return VALID_LR_SCHEDULES


def _engines_in_graph(loss, wrappers_by_engine: dict, engine_of_param: dict) -> list:
    """The engine wrappers whose parameters `loss` depends on (a walk over its autograd graph)."""
    found, seen = {}, set()
    stack = [loss.grad_fn] if loss.grad_fn is not None else []
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        variable = getattr(node, "variable", None)
        if variable is not None and id(variable) in engine_of_param:
            engine_id = engine_of_param[id(variable)]
            found[engine_id] = wrappers_by_engine[engine_id]
        stack.extend(next_node for next_node, _ in node.next_functions)
    return list(found.values())


def _op_is_built(op: str) -> bool:
    """Whether DeepSpeed's C++ op `op` is installed or already JIT-compiled in torch's extension cache."""
    from deepspeed.git_version_info import installed_ops

    if installed_ops.get(op):
        return True
    from torch.utils.cpp_extension import _get_build_directory

    try:
        folder = _get_build_directory(op, verbose=False)
    except Exception:  # noqa: BLE001 - no cache folder: not built
        return False
    return os.path.isfile(os.path.join(folder, f"{op}.so"))


def map_pytorch_optim_to_deepspeed(optimizer):
    """DeepSpeed's CPU implementation of a torch optimizer, used with ZeRO-Offload: torch's Adagrad becomes
    `DeepSpeedCPUAdagrad`, anything else `DeepSpeedCPUAdam` (in AdamW mode for `torch.optim.AdamW`)."""
    optimizer = inner_optimizer(optimizer)
    defaults = {k: v for k, v in optimizer.defaults.items() if k in ("lr", "weight_decay")}
    if isinstance(optimizer, torch.optim.Adagrad):
        from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad

        return DeepSpeedCPUAdagrad(optimizer.param_groups, **defaults)
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    return DeepSpeedCPUAdam(optimizer.param_groups, adamw_mode=isinstance(optimizer, torch.optim.AdamW), **defaults)


def GatheredParameters(params, modifier_rank=None, fwd_module=None, enabled=True):  # noqa: N802 - Accelerate's name
    """`deepspeed.zero.GatheredParameters` when some of `params` are ZeRO-3 partitioned (whole inside the block,
    changes by `modifier_rank` kept); a context that does nothing for ordinary parameters."""
    params = [params] if isinstance(params, torch.Tensor) else list(params)
    if not enabled or not any(hasattr(p, "ds_id") for p in params):
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(params, modifier_rank=modifier_rank, fwd_module=fwd_module, enabled=True)
