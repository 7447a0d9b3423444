"""Per-process shared state: who this process is, which device it uses, how the run is distributed.

Every instance of `PartialState`, `AcceleratorState` and `GradientState` in a process shares one dict of
attributes (Accelerate's semantics), so any part of a program can build one cheaply and see the same
answers. Tests start over with `PartialState._reset_state()` / `AcceleratorState._reset_state(True)`.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from contextlib import contextmanager
from functools import partial

import torch

from .config.handlers import given_kwargs
from .core.env import parse_flag_from_env
from .core.enums import TORCH_DISTRIBUTED_TYPES, DistributedType
from .core.errors import ConfigError, StateResetError
from .distributed import cluster as environment
from .distributed import sequence_parallel
from .distributed.bootstrap import collective_timeout, init_process_group

__all__ = ["PartialState", "AcceleratorState", "GradientState", "DistributedType", "is_initialized"]
logger = logging.getLogger(__name__)  # Accelerate's module-level logger, at its path



def do_nothing(*args, **kwargs):
    """Accepts anything and returns None: what `on_main_process`-style decorators hand other processes."""
    return None


_no_op = do_nothing


class ThreadLocalSharedDict(threading.local):
    """A class attribute (descriptor) holding one dict per thread, shared by every instance in that thread.

    Accelerate uses it for the Borg state under torch_xla's multithreaded PJRT, and so does hasten: where torch_xla
    is installed (and USE_TORCH_XLA is not 0), replicas started as threads by `xmp.spawn` each see their own
    state. Elsewhere `SharedDict` is a plain `dict`. Replace the stored dict
    through an instance (`obj.attr = {...}`) or mutate it in place: assigning on the class replaces the
    descriptor itself.
    """

    def __init__(self, thread_local: bool = False):
        self._storage = {}

    def __get__(self, obj, objtype=None):
        return self._storage

    def __set__(self, obj, value):
        self._storage = value


def _xla_installed() -> bool:
    from .core.availability import is_torch_xla_available

    return is_torch_xla_available()


# The Borg states share one dict per process, or per thread where XLA replicas may be threads of one process.
SharedDict = ThreadLocalSharedDict if _xla_installed() else dict


class _SharedState:
    """Borg base: every instance of a subclass uses the class's one `_shared_state` dict."""

    _shared_state: dict = {}
    _known_attrs: tuple = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls._shared_state = SharedDict()

    def __getattr__(self, name):
        # Only reached when normal lookup failed: after a reset, say why instead of a bare AttributeError.
        # A property whose field is gone also lands here (its AttributeError is swallowed by Python).
        if name in type(self)._known_attrs or (not self._shared_state and hasattr(type(self), name)):
            raise StateResetError(
                f"`{type(self).__name__}` object has no attribute `{name}`. This happens if "
                f"`{type(self).__name__}._reset_state()` was called and an `Accelerator` or `PartialState` was not "
                f"reinitialized: the state was reset and not created again. Build a new `{type(self).__name__}()` "
                "(or `Accelerator()`) after `_reset_state()`."
            )
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")


class PartialState(_SharedState):
    """Process and device information, without any training objects. Cheap to build anywhere."""

    _known_attrs = (
        "_cpu", "backend", "device", "debug", "distributed_type", "num_processes", "process_index",
        "local_process_index", "fork_launched", "cluster",
    )

    def __init__(self, cpu: bool = False, **kwargs):
        self.__dict__ = self._shared_state
        already = self.initialized
        self.fork_launched = parse_flag_from_env("FORK_LAUNCHED", False)
        if already:
            return
        try:
            self._initialize(cpu, kwargs)
        except BaseException:
            # A half-built state would look initialized to the next `PartialState()`; leave none instead.
            self._shared_state.clear()
            raise

    def _initialize(self, cpu: bool, kwargs: dict) -> None:
        env = os.environ
        requested_backend = kwargs.pop("backend", None)
        kwargs.pop("_use_sagemaker_dp", None)
        fsdp_cpu_tensors = kwargs.pop("_fsdp_cpu_tensors", None)  # the run plan's FSDP plugin (hasten/plan/)
        cpu = bool(_setting("use_cpu", bool(cpu), env))
        cluster = environment.detect_cluster(env)
        if not cpu and _xla_installed():  # as Accelerate: an installed torch_xla makes the run an XLA one
            self._initialize_xla(cluster, requested_backend, kwargs, env)
            return
        device_type = environment.detect_device_type(cpu, env)
        # Under torchrun even one process joins a group (its agent hosts the store, and scripts expect one);
        # a lone `srun -n1` / `mpirun -n 1` task stays single instead of opening a port for itself.
        launched = cluster.launcher == "torchrun" or cluster.world_size > 1
        distributed_type = environment.distributed_type_for(device_type, cluster.world_size, launched)

        self._cpu = cpu or device_type == "cpu"
        self.debug = bool(_setting("debug", None, env))
        backend = None if distributed_type == DistributedType.NO else environment.choose_backend(
            device_type, requested_backend, env, fsdp_cpu_tensors=fsdp_cpu_tensors)
        # One timeout for every collective: gloo/NCCL here, DeepSpeed's groups, the hang doctor.
        self.collective_timeout = collective_timeout(kwargs.get("timeout"), backend)
        self.cluster = cluster
        self.distributed_type = distributed_type
        # The device is chosen, and made current, before the group is joined: NCCL binds each process to the
        # current device when it first communicates.
        self.local_process_index = 0 if distributed_type == DistributedType.NO else cluster.local_rank
        self.device = self._pick_device(device_type)
        self.set_device()
        if distributed_type == DistributedType.NO:
            self.backend = None
            self.num_processes, self.process_index = 1, 0
        else:
            import torch.distributed as dist

            if not dist.is_initialized():
                init_process_group(cluster, backend, kwargs)
            self.backend = dist.get_backend()
            if requested_backend and self.backend != requested_backend:
                raise ConfigError(
                    f"backend {requested_backend!r} was asked for, but the process group already uses "
                    f"{self.backend!r}"
                )
            self.num_processes = dist.get_world_size()
            self.process_index = dist.get_rank()
        if self.debug and self.use_distributed:
            from .resilience import hang_doctor

            hang_doctor.install(self.collective_timeout.total_seconds(), _setting("hang_doctor_wait", None, env))
        if _setting("enable_cpu_affinity", None, env):
            from .distributed import numa

            numa.pin_to_numa_node(self.device.type, numa.pci_bus_id(self.device), self.local_process_index)

    def _initialize_xla(self, cluster, requested_backend, kwargs: dict, env) -> None:
        """One XLA replica (of `xr.world_size()`): its ordinals come from torch_xla, not torch.distributed."""
        from .distributed import xla

        if requested_backend not in (None, "xla"):
            raise ConfigError(f"Your assigned backend {requested_backend} is not available, please use xla "
                              "(torch_xla is installed; set USE_TORCH_XLA=0 to run without it)")
        xla.ACTIVE = True
        self._cpu = False
        self.debug = bool(_setting("debug", None, env))
        self.collective_timeout = collective_timeout(kwargs.get("timeout"), None)
        self.cluster = cluster
        self.distributed_type = DistributedType.XLA
        self.backend = "xla"
        self.device = xla.device()
        self.num_processes = xla.world_size()
        self.process_index = xla.global_ordinal()
        # torch_xla knows the local ordinal off a TPU host too (Accelerate gives -1 there).
        self.local_process_index = xla.local_ordinal()

    def _pick_device(self, device_type: str) -> torch.device:
        forced = _setting("torch_device")
        if forced:
            return torch.device(forced)
        if device_type in ("cpu", "mps"):
            return torch.device(device_type)
        return torch.device(device_type, device_index(device_type, self.local_process_index))

    # -- identity -----------------------------------------------------------------------------------------
    @property
    def initialized(self) -> bool:
        return self._shared_state != {}

    @property
    def use_distributed(self) -> bool:
        return self.distributed_type != DistributedType.NO and self.num_processes > 1

    @property
    def is_main_process(self) -> bool:
        return self.process_index == 0

    @property
    def is_local_main_process(self) -> bool:
        return self.local_process_index == 0

    @property
    def is_last_process(self) -> bool:
        return self.process_index == self.num_processes - 1

    @property
    def default_device(self) -> torch.device:
        return torch.device(environment.detect_device_type(False))

    def set_device(self) -> None:
        if self.device.type not in ("cpu", "mps", "meta", "xla") and self.device.index is not None:
            getattr(torch, self.device.type).set_device(self.device)

    def __repr__(self) -> str:
        return (
            f"Distributed environment: {self.distributed_type}{('  Backend: ' + self.backend) if self.backend else ''}\n"
            f"Num processes: {self.num_processes}\n"
            f"Process index: {self.process_index}\n"
            f"Local process index: {self.local_process_index}\n"
            f"Device: {self.device}\n"
        )

    @classmethod
    def _reset_state(cls) -> None:
        """Forget everything (for tests). An existing torch.distributed group is kept and reused."""
        cls._shared_state.clear()

    # -- synchronisation ----------------------------------------------------------------------------------
    def wait_for_everyone(self) -> None:
        """Block until every process reaches this point (no-op in a single process)."""
        if self.num_processes > 1 and (self.distributed_type in TORCH_DISTRIBUTED_TYPES
                                       or self.distributed_type == DistributedType.XLA):
            from .distributed import control

            # A control-plane barrier (gloo): it involves no device, so it cannot name the wrong GPU.
            control.barrier()

    @contextmanager
    def _goes_first(self, is_first: bool):
        if not is_first:
            self.wait_for_everyone()
        yield
        if is_first:
            self.wait_for_everyone()

    @contextmanager
    def main_process_first(self):
        """The main process runs the block first; the others run it after it is done."""
        with self._goes_first(self.is_main_process):
            yield

    @contextmanager
    def local_main_process_first(self):
        """Each machine's local main process runs the block first."""
        with self._goes_first(self.is_local_main_process):
            yield

    @contextmanager
    def split_between_processes(self, inputs, apply_padding: bool = False):
        """Yield this process's contiguous share of a list, tuple, tensor or dict of equal-length values."""
        from .core.nested import split_for_process

        if self.num_processes == 1:
            yield inputs
            return
        yield split_for_process(inputs, self.process_index, self.num_processes, apply_padding, self.device)

    # -- decorators ---------------------------------------------------------------------------------------
    def _only_on(self, is_selected, function):
        """`function` itself where `is_selected(self)` (or when not distributed), else a do-nothing function.

        Decided once, when the decorator is applied, as in Accelerate.
        """
        if not self.initialized:
            raise ValueError("The state is not initialized: build a `PartialState()` or `Accelerator()` first.")
        if not self.use_distributed or is_selected(self):
            return function
        return _no_op

    def on_main_process(self, function=None):
        """Run `function` only on the main process (others get a function that does nothing)."""
        return self._only_on(lambda s: s.is_main_process, function)

    def on_local_main_process(self, function=None):
        return self._only_on(lambda s: s.is_local_main_process, function)

    def on_last_process(self, function=None):
        return self._only_on(lambda s: s.is_last_process, function)

    def on_process(self, function=None, process_index=None):
        if function is None:
            return partial(self.on_process, process_index=process_index)
        return self._only_on(lambda s: s.process_index == process_index, function)

    def on_local_process(self, function=None, local_process_index=None):
        if function is None:
            return partial(self.on_local_process, local_process_index=local_process_index)
        return self._only_on(lambda s: s.local_process_index == local_process_index, function)

    def print(self, *args, **kwargs) -> None:
        """`print` once per machine (on the local main process)."""
        if self.is_local_main_process:
            print(*args, **kwargs)

    def destroy_process_group(self, group=None) -> None:
        if self.fork_launched and group is None:
            return
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group(group)
            if group is None:
                from .distributed import control

                control.reset()  # the control group went with the default one
            # A DDP model can still hold the gloo group; freeing it later joins gloo's worker threads with the GIL
            # held, and a worker still dropping the last collective (which needs the GIL) then waits forever
            # (seen at the end of Accelerate's test_metrics: the Accelerator holding the model went when main()
            # returned). Let the workers finish now, while nothing holds the GIL against them.
            from .distributed.bootstrap import wait_for_gloo_workers

            wait_for_gloo_workers()


class AcceleratorState(_SharedState):
    """`PartialState` plus training-wide choices: mixed precision and the distribution plugins."""

    _known_attrs = PartialState._known_attrs + (
        "_mixed_precision", "dynamo_plugin", "deepspeed_plugins", "fsdp_plugin", "megatron_lm_plugin",
        "torch_tp_plugin", "parallelism_config", "device_mesh",
    )

    def __init__(
        self,
        mixed_precision: str | None = None,
        cpu: bool = False,
        dynamo_plugin=None,
        deepspeed_plugin=None,
        fsdp_plugin=None,
        torch_tp_plugin=None,
        megatron_lm_plugin=None,
        parallelism_config=None,
        _from_accelerator: bool = False,
        _run_plan=None,
        **kwargs,
    ):
        self.__dict__ = self._shared_state
        cpu = bool(_setting("use_cpu", bool(cpu)))
        if self.initialized:
            if not PartialState._shared_state:  # reset on its own (tests do): set it up again, as Accelerate does
                PartialState(cpu, **kwargs)
            if cpu and self.device.type != "cpu":
                raise ValueError(
                    "AcceleratorState has already been initialized on a device and cannot be switched to "
                    "cpu=True; call `AcceleratorState._reset_state(True)` first (tests only)."
                )
            if mixed_precision is not None and str(mixed_precision).lower() != self._mixed_precision:
                raise ValueError(
                    f"AcceleratorState has already been initialized with mixed_precision={self._mixed_precision!r}; "
                    f"it cannot change to {mixed_precision!r} in the same process."
                )
            return
        if not _from_accelerator:
            raise ValueError(
                "Please make sure to properly initialize your accelerator via `accelerator = Accelerator()` "
                "before using any functionality from `AcceleratorState`."
            )
        partial_state = PartialState(cpu, **kwargs)
        self.__dict__.update(partial_state.__dict__)
        if _run_plan is None:
            # Built by hand (Accelerate's public constructor; an Accelerator always hands its plan): the same plan
            # function decides, from the arguments given here, as an Accelerator's would.
            from .plan import Cluster, make_run_plan

            if isinstance(deepspeed_plugin, dict):
                deepspeed_plugin, deepspeed_plugins = None, deepspeed_plugin
            else:
                deepspeed_plugins = None
            _run_plan = make_run_plan(
                cluster=lambda _fsdp_plugin: Cluster(partial_state.num_processes, partial_state.device.type,
                                                     partial_state.distributed_type),
                mixed_precision=mixed_precision, deepspeed_plugin=deepspeed_plugin, deepspeed_plugins=deepspeed_plugins,
                fsdp_plugin=fsdp_plugin, torch_tp_plugin=torch_tp_plugin, megatron_lm_plugin=megatron_lm_plugin,
                dynamo_plugin=dynamo_plugin, parallelism_config=parallelism_config, plan_accumulation=False)
        self._take_plan(_run_plan)

    def _take_plan(self, plan) -> None:
        """Everything the state holds about how the run is distributed, as the run plan decided it."""
        self._mixed_precision = plan.precision.setting
        self.dynamo_plugin = plan.dynamo_plugin
        self.deepspeed_plugins = plan.deepspeed_plugins
        self.fsdp_plugin = plan.fsdp_plugin
        self.megatron_lm_plugin = plan.megatron_lm_plugin
        self.torch_tp_plugin = None  # the deprecated plugin became plan.parallelism_config
        self.parallelism_config = plan.parallelism_config
        self.device_mesh = None
        # PartialState answers as this state does (PartialState().distributed_type is FSDP under FSDP).
        self.distributed_type = PartialState._shared_state["distributed_type"] = plan.distributed_type

    @property
    def initialized(self) -> bool:
        return self._shared_state != PartialState._shared_state and self._shared_state != {}

    @property
    def mixed_precision(self) -> str:
        plugin = self.deepspeed_plugin if self.distributed_type == DistributedType.DEEPSPEED else None
        return self._mixed_precision if plugin is None else plugin.mixed_precision

    @property
    def is_fsdp2(self) -> bool:
        plugin = getattr(self, "fsdp_plugin", None)
        return self.distributed_type == DistributedType.FSDP and getattr(plugin, "fsdp_version", 1) == 2

    @property
    def deepspeed_plugin(self):
        plugins = getattr(self, "deepspeed_plugins", None)
        if isinstance(plugins, dict):
            return next((p for p in plugins.values() if getattr(p, "selected", False)), None)
        return plugins

    def get_deepspeed_plugin(self, name: str):
        plugins = getattr(self, "deepspeed_plugins", None)
        if not isinstance(plugins, dict) or name not in plugins:
            known = ", ".join(plugins) if isinstance(plugins, dict) else "none"
            raise ValueError(f"no DeepSpeed plugin named {name!r} (known: {known})")
        return plugins[name]

    def select_deepspeed_plugin(self, name: str | None = None) -> None:
        """Make the plugin `name` the active one: the next prepare() builds its engine with it."""
        plugins = getattr(self, "deepspeed_plugins", None)
        if not isinstance(plugins, dict):
            raise ValueError("select_deepspeed_plugin needs Accelerator(deepspeed_plugins={name: plugin, ...})")
        chosen = self.get_deepspeed_plugin(name)
        for plugin in plugins.values():
            plugin._unselect()
        chosen.select(_from_accelerator_state=True)

    def __repr__(self) -> str:
        return PartialState().__repr__() + f"\nMixed precision type: {self.mixed_precision}\n"

    @classmethod
    def _reset_state(cls, reset_partial_state: bool = False) -> None:
        cls._shared_state.clear()
        if reset_partial_state:
            PartialState._reset_state()

    # Delegated process-level behaviour, answered by PartialState: it survives `AcceleratorState._reset_state()`
    # (scripts ask `accelerator.is_local_main_process` after resetting, as Accelerate's test_metrics does).
    @property
    def use_distributed(self) -> bool:
        return PartialState().use_distributed

    @property
    def is_main_process(self) -> bool:
        return PartialState().is_main_process

    @property
    def is_local_main_process(self) -> bool:
        return PartialState().is_local_main_process

    @property
    def is_last_process(self) -> bool:
        return PartialState().is_last_process

    def wait_for_everyone(self):
        PartialState().wait_for_everyone()

    def main_process_first(self):
        return PartialState().main_process_first()

    def local_main_process_first(self):
        return PartialState().local_main_process_first()

    def split_between_processes(self, inputs, apply_padding: bool = False):
        return PartialState().split_between_processes(inputs, apply_padding=apply_padding)

    def print(self, *args, **kwargs):
        PartialState().print(*args, **kwargs)

    def destroy_process_group(self, group=None):
        PartialState().destroy_process_group(group)

    @property
    def fork_launched(self):
        return parse_flag_from_env("FORK_LAUNCHED", False)


# The variables that hand each process its own devices (a scheduler's per-task binding or a wrapper's).
VISIBLE_DEVICES = {"cuda": ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"),
                   "xpu": ("ZE_AFFINITY_MASK",), "npu": ("ASCEND_RT_VISIBLE_DEVICES",)}


def device_index(device_type: str, local_index: int, count: int | None = None, env=None) -> int:
    """The accelerator this process uses: its local rank, or 0 when it sees one device only because it was given
    its own (SLURM `--gpus-per-task=1`, a per-process `CUDA_VISIBLE_DEVICES`). More processes on a machine than
    visible devices is refused: they would share a device (and NCCL refuses two ranks on one GPU). With one
    visible device and no visible-devices variable, the machine has one device: local process 1 and up are
    refused too (Accelerate takes the local rank modulo the count and puts them all on it)."""
    if count is None:
        count = getattr(torch, device_type).device_count()
    env = os.environ if env is None else env
    own_device = count == 1 and any(env.get(name) for name in VISIBLE_DEVICES.get(device_type, ()))
    if local_index < count or own_device:
        return local_index if count > 1 else 0
    raise ConfigError(
        f"local process {local_index} has no {device_type} device of its own: this machine shows {count} "
        f"{device_type} device{'s' if count != 1 else ''}; start at most {count} process"
        f"{'es' if count != 1 else ''} per machine (`--num_processes`), or give each process its own device "
        f"(CUDA_VISIBLE_DEVICES), or name one with HASTEN_TORCH_DEVICE"
    )


def _setting(name: str, code=None, env=None):
    """A setting's value by the one precedence `hasten config explain` reports (hasten.config.resolve)."""
    from .config.resolve import runtime_value

    return runtime_value(name, code, env).value


def _run_layout():
    """The ParallelismConfig of this process's run (the shared AcceleratorState's), or None."""
    return AcceleratorState._shared_state.get("parallelism_config")


sequence_parallel.run_layout = _run_layout  # sp_group() reads the run's layout through it (distributed/ is below)


def detected_cluster(cpu: bool = False, **kwargs):
    """`make_run_plan`'s `cluster` in a training process: `PartialState(cpu, **kwargs)` (made on the first call,
    which joins the process group) and the AcceleratorState an earlier Accelerator left, if any. The FSDP plugin
    the plan holds then decides whether the default group must serve CPU tensors too (CPU offload, a full state
    dict): a plugin built in code says so only through its fields, which the launcher's variables do not carry."""
    from .plan import Cluster

    def detect(fsdp_plugin=None) -> Cluster:
        hint = {} if fsdp_plugin is None else {"_fsdp_cpu_tensors": fsdp_plugin.meets_cpu_tensors}
        state = PartialState(cpu, **kwargs, **hint)
        settled = AcceleratorState() if is_initialized() else None
        return Cluster(state.num_processes, state.device.type, state.distributed_type, settled)

    return detect


def holds_deepspeed_plugins() -> bool:
    """Whether an earlier Accelerator of this process holds DeepSpeed plugins (read without making a state)."""
    return bool(AcceleratorState._shared_state.get("deepspeed_plugins"))


def is_initialized() -> bool:
    return AcceleratorState._shared_state != {}


class GradientState(_SharedState):
    """Whether gradients synchronise on this step, and which prepared data loader is being iterated.

    The accumulation settings (`num_steps`, `adjust_scheduler`, `sync_with_dataloader`, `sync_each_batch`) are
    plain attributes, refreshed whenever `plugin_kwargs` is set: they are read on every micro-step.
    """

    _known_attrs = ("sync_gradients", "_plugin_kwargs", "_dataloader_references", "num_steps", "adjust_scheduler",
                    "sync_with_dataloader", "sync_each_batch")

    def __init__(self, gradient_accumulation_plugin=None):
        self.__dict__ = self._shared_state
        if not self.initialized:
            self.sync_gradients = True
            self._dataloader_references = []
            self.plugin_kwargs = {}
            self._is_xla_gradients_synced = False
        if gradient_accumulation_plugin is not None:
            # to_kwargs() drops values equal to the plugin's defaults, and a missing adjust_scheduler reads False
            # here: an explicit adjust_scheduler=True is kept, not silently dropped as in Accelerate.
            self.plugin_kwargs = given_kwargs(gradient_accumulation_plugin, ("adjust_scheduler",))

    @property
    def initialized(self) -> bool:
        return self._shared_state != {}

    @property
    def plugin_kwargs(self) -> dict:
        return self._plugin_kwargs

    @plugin_kwargs.setter
    def plugin_kwargs(self, kwargs: dict) -> None:
        self._plugin_kwargs = kwargs
        self.num_steps = kwargs.get("num_steps", 1)
        self.adjust_scheduler = kwargs.get("adjust_scheduler", False)
        self.sync_with_dataloader = kwargs.get("sync_with_dataloader", True)
        self.sync_each_batch = kwargs.get("sync_each_batch", False)

    @property
    def dataloader_references(self):
        return [ref() for ref in self._dataloader_references] or [None]

    @property
    def active_dataloader(self):
        return self.dataloader_references[-1]

    @property
    def in_dataloader(self) -> bool:
        return self.active_dataloader is not None

    @property
    def end_of_dataloader(self) -> bool:
        references = self._dataloader_references
        if not references:  # the common case, checked on every step
            return False
        loader = references[-1]()
        return bool(loader is not None and loader.end_of_dataloader)

    @property
    def remainder(self) -> int:
        loader = self.active_dataloader
        return -1 if loader is None else loader.remainder

    @property
    def is_xla_gradients_synced(self) -> bool:
        return self._is_xla_gradients_synced

    @is_xla_gradients_synced.setter
    def is_xla_gradients_synced(self, value: bool) -> None:
        self._is_xla_gradients_synced = value

    def _set_sync_gradients(self, sync_gradients: bool) -> None:
        self.sync_gradients = sync_gradients

    def _add_dataloader(self, dataloader) -> None:
        # Nested loaders form a stack; weak references so a forgotten loader does not live forever.
        self._dataloader_references = self._dataloader_references + [weakref.ref(dataloader)]

    def _remove_dataloader(self, dataloader) -> None:
        self._dataloader_references = [r for r in self._dataloader_references if r() is not dataloader]

    def __repr__(self) -> str:
        return (
            f"Sync Gradients: {self.sync_gradients}\n"
            f"At end of current dataloader: {self.end_of_dataloader}\n"
            f"Extra samples added: {self.remainder}\n"
            f"Gradient accumulation plugin: {self.plugin_kwargs}\n"
        )

    @classmethod
    def _reset_state(cls) -> None:
        cls._shared_state.clear()
