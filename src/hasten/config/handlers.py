"""User-facing configuration objects: kwargs handlers and plugins, with Accelerate's fields and defaults."""

from __future__ import annotations

import copy
import weakref
from dataclasses import dataclass, field, fields
from datetime import timedelta
from typing import Any, Callable, Optional

from ..core.enums import DDPCommunicationHookType, DynamoBackend
from ..core.errors import ConfigError


# id(handler) -> the fields its constructor was given; dropped with the handler (weakref.finalize).
_EXPLICIT: dict = {}


class KwargsHandler:
    """Mixin: `to_kwargs()` returns the fields whose values differ from a default instance, as Accelerate documents
    (values taken from HASTEN_/ACCELERATE_ variables count as different). The handler also remembers which fields
    its constructor was given (`given_kwargs`), for hasten's own callers that must honour a value passed on purpose
    even when it equals the default."""

    def __new__(cls, *args, **kwargs):
        handler = super().__new__(cls)
        names = [f.name for f in fields(cls)] if hasattr(cls, "__dataclass_fields__") else []
        _EXPLICIT[id(handler)] = frozenset(names[:len(args)]) | frozenset(kwargs)
        weakref.finalize(handler, _EXPLICIT.pop, id(handler), None)
        return handler

    def to_dict(self) -> dict:
        return copy.deepcopy(self.__dict__)

    def to_kwargs(self) -> dict:
        # The default instance is built with the environment hidden from the settings resolver (in this thread
        # only: os.environ is never touched), so values that came from the environment differ from it.
        from .resolve import environment_hidden

        with environment_hidden():
            default = self.__class__().to_dict()
        return {k: v for k, v in self.to_dict().items() if k in default and default[k] != v}


def given_kwargs(handler: KwargsHandler, names=None) -> dict:
    """`handler.to_kwargs()` plus the fields its constructor was given (all of them, or those among `names`), even
    where equal to the default: `InitProcessGroupKwargs(timeout=timedelta(seconds=600))` must give 600 s on gloo,
    where hasten's own default is 1800 s."""
    kwargs = handler.to_kwargs()
    current = handler.to_dict()
    for name in _EXPLICIT.get(id(handler), frozenset()):
        if name in current and (names is None or name in names):
            kwargs[name] = current[name]
    return kwargs


@dataclass
class AutocastKwargs(KwargsHandler):
    """Arguments for `torch.autocast` (`enabled=False` forces fp32 inside `accelerator.autocast`)."""

    enabled: bool = True
    cache_enabled: Optional[bool] = None


@dataclass
class DistributedDataParallelKwargs(KwargsHandler):
    """Arguments for `torch.nn.parallel.DistributedDataParallel`, plus an optional communication hook."""

    dim: int = 0
    broadcast_buffers: bool = True
    bucket_cap_mb: int = 25
    find_unused_parameters: bool = False
    check_reduction: bool = False
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    comm_hook: DDPCommunicationHookType = DDPCommunicationHookType.NO
    comm_wrapper: DDPCommunicationHookType = DDPCommunicationHookType.NO
    comm_state_option: dict = field(default_factory=dict)

    def __post_init__(self):
        hook = DDPCommunicationHookType(self.comm_hook)
        if self.check_reduction:
            # torch's DDP takes it, warns that it is deprecated and does nothing (the reducer always checks its
            # reductions): as in Accelerate it reaches DDP, which says so; hasten's strict setting refuses it here.
            from .resolve import strict

            if strict():
                raise ConfigError("DistributedDataParallelKwargs(check_reduction=True) has no effect in torch's DDP; "
                                  "fix: drop it (find_unused_parameters=True for parameters that get no gradient; an "
                                  "error under hasten's strict setting)")
        if DDPCommunicationHookType(self.comm_wrapper) != DDPCommunicationHookType.NO and \
                hook == DDPCommunicationHookType.NO:
            raise ConfigError(f"DistributedDataParallelKwargs(comm_wrapper={self.comm_wrapper!r}) wraps a "
                              "communication hook, but comm_hook is 'no'; fix: set comm_hook too (e.g. 'power_sgd')")
        if self.comm_state_option and hook not in (DDPCommunicationHookType.POWER_SGD,
                                                   DDPCommunicationHookType.BATCHED_POWER_SGD):
            raise ConfigError(f"DistributedDataParallelKwargs(comm_state_option={self.comm_state_option!r}) "
                              f"configures PowerSGD, but comm_hook is {hook.value!r}; fix: comm_hook='power_sgd' "
                              "or 'batched_power_sgd', or drop comm_state_option")

    def to_dict(self, ignore_keys=("comm_hook", "comm_wrapper", "comm_state_option")) -> dict:
        return {k: v for k, v in super().to_dict().items() if k not in ignore_keys}

    def register_comm_hook(self, model) -> None:
        """Install the chosen gradient-compression hook on a DDP model."""
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

        hook_type = DDPCommunicationHookType(self.comm_hook)
        wrapper_type = DDPCommunicationHookType(self.comm_wrapper)
        if hook_type == DDPCommunicationHookType.NO:
            return
        hooks = {
            DDPCommunicationHookType.FP16: default_hooks.fp16_compress_hook,
            DDPCommunicationHookType.BF16: default_hooks.bf16_compress_hook,
            DDPCommunicationHookType.POWER_SGD: powerSGD_hook.powerSGD_hook,
            DDPCommunicationHookType.BATCHED_POWER_SGD: powerSGD_hook.batched_powerSGD_hook,
        }
        wrappers = {
            DDPCommunicationHookType.FP16: default_hooks.fp16_compress_wrapper,
            DDPCommunicationHookType.BF16: default_hooks.bf16_compress_wrapper,
        }
        hook = hooks[hook_type]
        state = None
        if hook_type in (DDPCommunicationHookType.POWER_SGD, DDPCommunicationHookType.BATCHED_POWER_SGD):
            state = powerSGD_hook.PowerSGDState(None, **self.comm_state_option)
        if wrapper_type != DDPCommunicationHookType.NO:
            if wrapper_type not in wrappers:
                raise ConfigError(f"comm_wrapper must be one of 'no', 'fp16', 'bf16', not {wrapper_type.value!r}")
            hook = wrappers[wrapper_type](hook)
        model.register_comm_hook(state, hook)


@dataclass
class GradScalerKwargs(KwargsHandler):
    """Arguments for the fp16 `torch.amp.GradScaler`."""

    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    enabled: bool = True


@dataclass
class InitProcessGroupKwargs(KwargsHandler):
    """Arguments for `torch.distributed.init_process_group`."""

    backend: Optional[str] = "nccl"
    init_method: Optional[str] = None
    timeout: Optional[timedelta] = None

    def __post_init__(self):
        if self.timeout is None:
            seconds = 600 if self.backend == "nccl" else 1800
            self.timeout = timedelta(seconds=seconds)


@dataclass
class ProfileKwargs(KwargsHandler):
    """Settings for `torch.profiler.profile`, used by `Accelerator.profile`."""

    activities: Optional[list] = None
    schedule_option: Optional[dict] = None
    on_trace_ready: Optional[Callable] = None
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    with_flops: bool = False
    with_modules: bool = False
    output_trace_dir: Optional[str] = None

    _SCHEDULE_KEYS = ("wait", "warmup", "active", "repeat", "skip_first", "skip_first_wait")

    def __post_init__(self):
        if self.schedule_option is None:
            return
        if not isinstance(self.schedule_option, dict):
            raise ConfigError(f"ProfileKwargs.schedule_option must be a dict such as dict(wait=1, warmup=1, "
                              f"active=3), got {self.schedule_option!r}")
        unknown = sorted(set(self.schedule_option) - set(self._SCHEDULE_KEYS))
        missing = [key for key in ("wait", "warmup", "active") if key not in self.schedule_option]
        if unknown or missing:
            raise ConfigError(f"ProfileKwargs.schedule_option {self.schedule_option!r}: "
                              + (f"unknown keys {unknown}; " if unknown else "")
                              + (f"missing {missing}; " if missing else "")
                              + f"it takes {list(self._SCHEDULE_KEYS)} (wait, warmup and active are required)")
        for key, value in self.schedule_option.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < (1 if key == "active" else 0):
                bound = "a positive integer" if key == "active" else "an integer >= 0"
                raise ConfigError(f"ProfileKwargs.schedule_option[{key!r}] must be {bound}, got {value!r}")

    def _activities(self):
        import torch

        names = {"cpu": torch.profiler.ProfilerActivity.CPU, "cuda": torch.profiler.ProfilerActivity.CUDA}
        for name in ("xpu", "mtia", "hpu"):  # offered where this torch has the device and it is present
            module = getattr(torch, name, None)
            available = getattr(module, "is_available", None)
            if hasattr(torch.profiler.ProfilerActivity, name.upper()) and available is not None and available():
                names[name] = getattr(torch.profiler.ProfilerActivity, name.upper())
        result = []
        for name in self.activities or []:
            if name not in names:
                raise ConfigError(f"Unknown profiler activity {name!r}; choose from {sorted(names)}")
            result.append(names[name])
        return result or None

    def build(self):
        import torch

        schedule = torch.profiler.schedule(**self.schedule_option) if self.schedule_option is not None else None
        return torch.profiler.profile(
            activities=self._activities(),
            schedule=schedule,
            on_trace_ready=self.on_trace_ready,
            record_shapes=self.record_shapes,
            profile_memory=self.profile_memory,
            with_stack=self.with_stack,
            with_flops=self.with_flops,
            with_modules=self.with_modules,
        )


@dataclass
class GradientAccumulationPlugin(KwargsHandler):
    """How gradient accumulation behaves (see docs/training.md)."""

    num_steps: Optional[int] = None
    adjust_scheduler: bool = True
    sync_with_dataloader: bool = True
    sync_each_batch: bool = False
    # hasten only (after Accelerate's fields): the window's gradient is that of the mean loss over all its tokens on
    # all data-parallel processes; needs accelerator.backward(loss, num_items_in_batch=n) (docs/training.md)
    normalize_by_tokens: Optional[bool] = None

    def __post_init__(self):
        if self.num_steps is not None and (not isinstance(self.num_steps, int) or self.num_steps < 1):
            raise ConfigError(f"GradientAccumulationPlugin.num_steps must be a positive integer, got {self.num_steps!r}")
        from .resolve import runtime_value

        self.normalize_by_tokens = bool(runtime_value("gradient_accumulation_normalize_by_tokens",
                                                      self.normalize_by_tokens).value)


@dataclass
class ProjectConfiguration:
    """Where a project writes checkpoints and logs, and how checkpoints are named and rotated."""

    project_dir: Optional[str] = None
    logging_dir: Optional[str] = None
    automatic_checkpoint_naming: bool = False
    total_limit: Optional[int] = None
    iteration: int = 0
    save_on_each_node: bool = False
    # hasten only (after Accelerate's fields, so positional construction still matches): see docs/fault_tolerance.md
    automatic_resume: bool = False  # load the newest complete checkpoint once everything it holds is prepared
    # SIGTERM/SIGUSR1 -> a checkpoint at a step boundary, then exit code 75; None: the value of automatic_resume
    handle_preemption: Optional[bool] = None

    def set_directories(self, project_dir: Optional[str] = None) -> None:
        self.project_dir = project_dir
        if self.logging_dir is None:
            self.logging_dir = project_dir

    def __post_init__(self):
        self.set_directories(self.project_dir)
        if self.total_limit is not None and (not isinstance(self.total_limit, int) or self.total_limit < 1):
            raise ConfigError(f"ProjectConfiguration.total_limit must be a positive integer or None, got {self.total_limit!r}")
        if self.handle_preemption is None:
            self.handle_preemption = bool(self.automatic_resume)
        for name in ("automatic_resume", "handle_preemption"):
            if getattr(self, name) and not self.automatic_checkpoint_naming:
                raise ConfigError(
                    f"ProjectConfiguration({name}=True) needs automatic_checkpoint_naming=True: it finds and writes "
                    "checkpoints under <project_dir>/checkpoints/checkpoint_<n>"
                )


@dataclass
class DataLoaderConfiguration:
    """How prepared data loaders shard and place batches."""

    split_batches: bool = False
    dispatch_batches: Optional[bool] = None
    even_batches: bool = True
    use_seedable_sampler: bool = False
    data_seed: Optional[int] = None
    non_blocking: bool = False
    use_stateful_dataloader: bool = False


@dataclass
class TorchDynamoPlugin(KwargsHandler):
    """`torch.compile` settings; unset fields come from `HASTEN_/ACCELERATE_DYNAMO_*`."""

    backend: Optional[DynamoBackend] = None
    mode: Optional[str] = None
    fullgraph: Optional[bool] = None
    dynamic: Optional[bool] = None
    options: Any = None
    disable: bool = False
    use_regional_compilation: Optional[bool] = None

    def __post_init__(self):
        from .resolve import runtime_value  # the one precedence: argument > HASTEN_/ACCELERATE_DYNAMO_* > default

        self.backend = runtime_value("dynamo_backend", self.backend).value
        try:
            self.backend = DynamoBackend(str(self.backend).upper())
        except ValueError:
            raise ConfigError(
                f"Unknown dynamo backend {self.backend!r}; choose one of {[b.lower() for b in DynamoBackend.list()]}"
            ) from None
        self.mode = runtime_value("dynamo_mode", self.mode).value
        self.fullgraph = bool(runtime_value("dynamo_use_fullgraph", self.fullgraph).value)
        self.use_regional_compilation = bool(
            runtime_value("dynamo_use_regional_compilation", self.use_regional_compilation).value
        )
        self.dynamic = runtime_value("dynamo_use_dynamic", self.dynamic).value

    def to_dict(self) -> dict:
        result = copy.deepcopy(self.__dict__)
        result["backend"] = result["backend"].value.lower()
        return result

    def to_kwargs(self) -> dict:
        kwargs = super().to_kwargs()
        kwargs.pop("use_regional_compilation", None)
        return kwargs


def field_names(cls) -> list[str]:
    return [f.name for f in fields(cls)]
