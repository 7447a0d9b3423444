"""`ParallelismConfig`: the sizes of data, sharded-data, tensor and context parallelism, and the mesh they make.

Accelerate 1.15's surface (transformers imports it at start-up). What each layout runs (docs/parallelism.md):
`dp_replicate_size` alone: DDP; `dp_shard_size` alone: FSDP2; both: HSDP (FSDP2 over a ("dp_replicate", "dp_shard")
mesh); `tp_size`: tensor parallelism for any nn.Module (`hasten.distributed.tp_plan`), composed with FSDP2 over the data
dimensions (`backends/tensor_parallel.py`); `pp_size` (a hasten extension): pipeline-parallel training of a sequence of
blocks with torch.distributed.pipelining's schedules, composed with TP and FSDP2/replicas (`backends/pipeline.py`).
Context parallelism needs CUDA (refused on CPU in one line, with the
reason). `sp_size` (Ulysses sequence parallelism): with `sp_backend="deepspeed"` (Accelerate's one value) DeepSpeed's
ALST keeps its own groups and no mesh is built; with `sp_backend="hasten"` the `sp` dimension joins the mesh and
composes with DDP (replicas) and FSDP2 (sharded over the flattened ("dp_shard", "sp") view), attention going through
`hasten.distributed.sequence_parallel`. Unset sizes are read from `PARALLELISM_CONFIG_*` through the
settings table, as Accelerate reads them.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Optional

from .core.enums import CP_COMM_STRATEGIES, PP_SCHEDULES, SP_BACKENDS
from .core.errors import ConfigError, NotBuiltError

# The order of the mesh dimensions, outermost first (Accelerate's: replicas outside, tensor parallel innermost).
# Pipeline stages outermost (torchtitan's order: the point-to-point sends cross the slowest links least often).
MESH_ORDER = ("pp", "dp_replicate", "dp_shard", "cp", "sp", "tp")
_ISSUE = "not built in hasten yet"
_KIND = {"tp": "tensor", "cp": "context", "sp": "sequence (DeepSpeed)"}


def _setting(name: str, code, default=None):
    """`code` > the row's variable > its default, through the settings table. A row not built (DeepSpeed sequence
    parallelism) has no variable to read: set, it is refused in one line; from code, `backend_for_layout` refuses."""
    import os

    from .config import settings
    from .config.resolve import BY_NAME, runtime_value

    if name in BY_NAME:
        return runtime_value(name, code).value
    if code is None:
        row = settings.BY_NAME[name]
        for variable in row.env:
            if os.environ.get(variable):
                row.refuse(f"environment variable {variable}={os.environ[variable]!r}")
    return default if code is None else code


@dataclass
class TorchTensorParallelConfig:
    """Options of tensor parallelism (`ParallelismConfig(tp_handler=...)`)."""

    enable_async_tp: bool = False
    # hasten's own: which modules to split. None: the model's `tp_plan`, else the automatic plan; "auto": the
    # automatic plan even when the model has one; a dict {module path pattern: style} (see hasten.distributed.tp_plan).
    tp_plan: Any = None

    def __post_init__(self):
        if self.tp_plan is not None and self.tp_plan != "auto" and not isinstance(self.tp_plan, dict):
            raise ConfigError(f"TorchTensorParallelConfig(tp_plan={self.tp_plan!r}) must be None, 'auto' or a dict of "
                              "module path -> style")
        if self.enable_async_tp:
            # Accelerate warns and runs without it (nothing runs differently): hasten does the same, and refuses it
            # under its strict setting.
            from .config.resolve import strict

            if strict():
                raise NotBuiltError(f"TorchTensorParallelConfig(enable_async_tp=True): async tensor parallelism is "
                                    f"{_ISSUE}; fix: leave enable_async_tp=False (an error under hasten's strict setting)")
            warnings.warn("Async tensor parallelism is currently not supported, ignoring this option.")


@dataclass
class TorchContextParallelConfig:
    """Options of context parallelism (`ParallelismConfig(cp_handler=...)`)."""

    cp_comm_strategy: Optional[str] = None

    def __post_init__(self):
        try:
            self.cp_comm_strategy = _setting("parallelism_config_cp_comm_strategy", self.cp_comm_strategy)
        except ConfigError as error:  # a bad value (or PARALLELISM_CONFIG_CP_COMM_STRATEGY): Accelerate's words first
            import os

            text = self.cp_comm_strategy or os.environ.get("PARALLELISM_CONFIG_CP_COMM_STRATEGY")
            if str(error).startswith("Invalid cp_comm_strategy"):
                raise
            raise ConfigError(f"Invalid cp_comm_strategy: {text} ({error})") from None
        if self.cp_comm_strategy not in CP_COMM_STRATEGIES:
            raise ConfigError(f"Invalid cp_comm_strategy: {self.cp_comm_strategy} (cp_comm_strategy must be one of "
                              f"{', '.join(CP_COMM_STRATEGIES)})")


@dataclass
class TorchPipelineParallelConfig:
    """Options of pipeline parallelism (`ParallelismConfig(pp_handler=...)`, a hasten extension).

    `schedule`: one of torch.distributed.pipelining's (`hasten.core.enums.PP_SCHEDULES`), case as torch spells it;
    `microbatches`: how many micro-batches each batch is cut into (None: one per stage of the whole pipeline);
    `stages_per_rank`: stages each process runs (1 for GPipe/1F1B, 2 by default for the others);
    `split_points`: the blocks (names or indices) that start each stage after the first (None: balanced by
    parameter count); `loss_fn(output, labels)`: the loss of one micro-batch, a mean over its items (None: mean
    cross-entropy of logits against labels)."""

    schedule: Optional[str] = None
    microbatches: Optional[int] = None
    stages_per_rank: Optional[int] = None
    split_points: Optional[list] = None
    loss_fn: Any = None

    def __post_init__(self):
        self.schedule = _setting("parallelism_config_pp_schedule", self.schedule)
        names = {name.lower(): name for name in PP_SCHEDULES}
        if not isinstance(self.schedule, str) or self.schedule.lower() not in names:
            raise ConfigError(f"pipeline schedule {self.schedule!r} is not one of {', '.join(PP_SCHEDULES)}")
        self.schedule = names[self.schedule.lower()]
        self.microbatches = _setting("parallelism_config_pp_microbatches", self.microbatches)
        for name in ("microbatches", "stages_per_rank"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigError(f"TorchPipelineParallelConfig {name}={value!r} must be a whole number of 1 or more")
        if self.loss_fn is not None and not callable(self.loss_fn):
            raise ConfigError(f"TorchPipelineParallelConfig loss_fn must be callable(output, labels), got "
                              f"{type(self.loss_fn).__name__}")
        from .distributed.pipeline import stages_per_rank_for

        self.stages_per_rank = stages_per_rank_for(self.schedule, self.stages_per_rank)


@dataclass
class TorchTensorParallelPlugin:
    """Accelerate's older tensor-parallel plugin (deprecated there in favour of `ParallelismConfig(tp_size=...)`)."""

    tp_size: int = 1
    torch_device_mesh: Any = None

    def __post_init__(self):
        if self.torch_device_mesh is not None:
            # Accelerate replaces a given mesh with one it builds from tp_size; hasten does too, and says so.
            from .config.resolve import strict

            text = ("TorchTensorParallelPlugin(torch_device_mesh=...) is not used: the run's mesh is built from tp_size "
                    "(as in Accelerate); fix: leave torch_device_mesh out")
            if strict():
                raise ConfigError(f"{text} (an error under hasten's strict setting)")
            warnings.warn(text, UserWarning, stacklevel=3)


@dataclass
class ParallelismConfig:
    """How many processes each kind of parallelism spans; their product is the number of processes."""

    dp_replicate_size: Optional[int] = None
    dp_shard_size: Optional[int] = None
    tp_size: Optional[int] = None
    cp_size: Optional[int] = None
    cp_backend: Optional[str] = None
    sp_size: Optional[int] = None
    sp_backend: Optional[str] = None
    tp_handler: Optional[TorchTensorParallelConfig] = None
    cp_handler: Optional[TorchContextParallelConfig] = None
    sp_handler: Any = None
    pp_size: Optional[int] = None  # hasten's: pipeline-parallel stages (docs/parallelism.md)
    pp_handler: Optional[TorchPipelineParallelConfig] = None
    _sizes: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    device_mesh = None  # a class attribute, as in Accelerate: set by get_device_mesh

    def __post_init__(self):
        for name in ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "sp_size", "pp_size"):
            value = _setting(f"parallelism_config_{name}", getattr(self, name), 1)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"ParallelismConfig {name}={value!r} must be a whole number of 1 or more")
            setattr(self, name, value)
        self.cp_backend = _setting("parallelism_config_cp_backend", self.cp_backend)
        if self.cp_backend != "torch":
            raise ConfigError(f"ParallelismConfig cp_backend={self.cp_backend!r} must be 'torch'")
        self.sp_backend = _setting("parallelism_config_sp_backend", self.sp_backend, "deepspeed")
        if self.sp_backend not in SP_BACKENDS:  # Accelerate's words first, then hasten's value
            raise ConfigError(f"sp_backend must be one of ['deepspeed'], but got {self.sp_backend} (hasten also takes "
                              "'hasten': Ulysses on the device mesh with DDP/FSDP2)")
        if self.cp_size > 1 and self.sp_size > 1:
            raise ConfigError("Context Parallelism (CP) and Sequence Parallelism (SP) are mutually exclusive. "
                              f"Got cp_size={self.cp_size} and sp_size={self.sp_size}. Please set either cp_size=1 or "
                              "sp_size=1.")
        if self.sp_size > 1 and self.sp_handler is None and self.sp_backend == "deepspeed":
            from .config.sequence_parallel import DeepSpeedSequenceParallelConfig

            self.sp_handler = DeepSpeedSequenceParallelConfig()
        if self.tp_size > 1 and self.tp_handler is None:
            self.tp_handler = TorchTensorParallelConfig()
        if self.pp_size > 1 and self.pp_handler is None:
            self.pp_handler = TorchPipelineParallelConfig()
        if self.pp_handler is not None and not isinstance(self.pp_handler, TorchPipelineParallelConfig):
            raise ConfigError(f"ParallelismConfig pp_handler must be a TorchPipelineParallelConfig, got "
                              f"{type(self.pp_handler).__name__}")
        if self.cp_size > 1 and self.cp_handler is None:
            self.cp_handler = TorchContextParallelConfig()
        if self.cp_handler is not None and not isinstance(self.cp_handler, TorchContextParallelConfig):
            raise ConfigError(f"ParallelismConfig cp_handler must be a TorchContextParallelConfig for cp_backend "
                              f"'torch', got {type(self.cp_handler).__name__}")
        self._sizes = {"dp_replicate": self.dp_replicate_size, "dp_shard": self.dp_shard_size, "tp": self.tp_size,
                       "cp": self.cp_size, "sp": self.sp_size, "pp": self.pp_size}

    def _set_size(self, dim: str, size: int) -> None:
        self._sizes[dim] = size
        setattr(self, f"{dim}_size", size)

    # -- sizes -------------------------------------------------------------------------------------------------
    @property
    def total_size(self) -> int:
        return self.dp_replicate_size * self.dp_shard_size * self.tp_size * self.cp_size * self.sp_size * self.pp_size

    @property
    def data_parallel_size(self) -> int:
        return self.dp_replicate_size * self.dp_shard_size

    @property
    def non_data_parallel_size(self) -> int:
        return self.tp_size * self.cp_size * self.sp_size * self.pp_size

    dp_replicate_enabled = property(lambda self: self.dp_replicate_size > 1)
    dp_shard_enabled = property(lambda self: self.dp_shard_size > 1)
    tp_enabled = property(lambda self: self.tp_size > 1)
    cp_enabled = property(lambda self: self.cp_size > 1)
    sp_enabled = property(lambda self: self.sp_size > 1)
    pp_enabled = property(lambda self: self.pp_size > 1)
    # hasten's Ulysses on the mesh (sp_backend="hasten"); DeepSpeed's keeps its own groups and builds no mesh.
    native_sp_enabled = property(lambda self: self.sp_size > 1 and self.sp_backend == "hasten")

    # -- mesh dimension names ----------------------------------------------------------------------------------
    def _enabled(self, *dims: str) -> list:
        return [dim for dim in dims if self._sizes[dim] > 1]

    @property
    def dp_dim_names(self) -> list:
        """Dimensions over which batches differ."""
        return self._enabled("dp_replicate", "dp_shard")

    @property
    def non_dp_dim_names(self) -> list:
        """Dimensions whose ranks receive the same batch."""
        return self._enabled("pp", "tp", "cp", "sp")

    @property
    def dp_shard_cp_dim_names(self) -> list:
        """Dimensions flattened into the one FSDP shards the model over (with hasten's sp, its ranks too: they
        hold the same weights and their gradients add up, as cp's do)."""
        return self._enabled("dp_shard", "cp", *self._native_sp())

    @property
    def dp_cp_dim_names(self) -> list:
        """Dimensions the loss is averaged over."""
        return self._enabled("dp_replicate", "dp_shard", "cp", *self._native_sp())

    def _native_sp(self) -> tuple:
        return ("sp",) if self.sp_backend == "hasten" else ()

    @property
    def fsdp_dim_names(self) -> list:
        return self._enabled("dp_replicate") + ["dp_shard_cp"]

    @property
    def active_mesh_dims(self) -> list:
        return self.dp_dim_names + self.non_dp_dim_names

    # -- the mesh ----------------------------------------------------------------------------------------------
    def build_device_mesh(self, device_type: str):
        """A DeviceMesh over the enabled dimensions (in `MESH_ORDER`), with the flattened views `dp`, `dp_shard_cp`
        and `dp_cp`; None when every size is 1 or with DeepSpeed sequence parallelism (DeepSpeed keeps its own)."""
        if self.sp_enabled and not self.native_sp_enabled:
            return None
        dims, shape = self._get_mesh()
        if not dims:
            return None
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(device_type, shape, mesh_dim_names=dims)
        # Kept here because torch deprecates slicing a flattened view back out of the root mesh (mesh["dp"]).
        self._views = {}
        for name, names in (("dp", self.dp_dim_names), ("dp_shard_cp", self.dp_shard_cp_dim_names),
                            ("dp_cp", self.dp_cp_dim_names)):
            if names:
                self._views[name] = mesh[names]._flatten(name)  # a list, as Accelerate slices it
        return mesh

    def _get_mesh(self) -> tuple[tuple, tuple]:
        """(dimension names, sizes) of the mesh `build_device_mesh` makes (Accelerate's private helper, kept
        because its tests and some scripts call it)."""
        dims = [dim for dim in MESH_ORDER if dim in self.active_mesh_dims]
        if self.dp_replicate_enabled and not self.dp_shard_enabled and (self.tp_enabled or self.cp_enabled
                                                                         or self.pp_enabled):
            dims.insert(dims.index("dp_replicate") + 1, "dp_shard")  # of size 1: FSDP2 replicates over ("dp_replicate", "dp_shard") (HSDP, 1 shard)
        return tuple(dims), tuple(self._sizes[dim] for dim in dims)

    def submesh(self, name: str):
        """One dimension of the built mesh, or one of its flattened views (`dp`, `dp_shard_cp`, `dp_cp`)."""
        if self.device_mesh is None:
            raise ConfigError(f"ParallelismConfig.submesh({name!r}): no mesh is built (every size is 1, or "
                              "get_device_mesh was not called)")
        views = getattr(self, "_views", {})
        return views[name] if name in views else self.device_mesh[name]

    def get_device_mesh(self, device_type: str | None = None):
        """The mesh, built on first call (a device type is then needed) and the same one afterwards."""
        if self.device_mesh is None:
            if device_type is None:
                raise ConfigError("ParallelismConfig.get_device_mesh needs a device_type (e.g. 'cuda') to build the "
                                  "mesh the first time")
            self.device_mesh = self.build_device_mesh(device_type)
        elif device_type is not None and self.device_mesh.device_type != device_type:
            raise ConfigError(f"the device mesh was built for {self.device_mesh.device_type!r}, not {device_type!r}")
        return self.device_mesh

    def to_json(self) -> dict:
        """The sizes and handlers as plain data (Accelerate's returns None: it builds the dict and drops it)."""
        data = {}
        for key, value in self.__dict__.items():
            if key == "device_mesh" or key.startswith("_"):
                continue
            data[key] = dict(value.__dict__) if hasattr(value, "__dict__") else value
        return data

    # -- what hasten can run -------------------------------------------------------------------------------------
    def _validate_accelerator(self, num_processes: int) -> None:
        """Fit the sizes to the run: all 1 on many processes means plain replication; otherwise the product must
        be the number of processes."""
        if self.total_size == 1 and num_processes > 1:
            self._set_size("dp_replicate", num_processes)
        if self.total_size != num_processes:
            sizes = ", ".join(f"{dim}_size={size}" for dim, size in self._sizes.items() if size > 1)
            raise ConfigError(f"ParallelismConfig sizes multiply to {self.total_size} ({sizes}) but this run has "
                              f"{num_processes} process(es); fix: make the product of the sizes {num_processes}")
        for dim, size in self._sizes.items():
            if size == 1 and getattr(self, f"{dim}_handler", None) is not None:
                warnings.warn(f"ParallelismConfig.{dim}_handler is set but {dim}_size is 1; the handler has "
                              "nothing to configure", UserWarning, stacklevel=3)


def fsdp_mesh(config: ParallelismConfig):
    """The (sub)mesh FSDP2 shards over: ("dp_replicate", "dp_shard_cp") for HSDP (a shard size of 1 replicates),
    `dp_shard_cp` for FSDP; None when no data-parallel or context dimension is in use."""
    mesh = config.device_mesh
    if mesh is None:
        return None
    names = mesh.mesh_dim_names
    if "dp_replicate" in names:
        inner = "dp_shard_cp" if config.cp_enabled or config.native_sp_enabled else "dp_shard"
        if inner == "dp_shard" and "dp_shard" not in names:
            return None  # dp_replicate alone: DDP
        return mesh[("dp_replicate", inner)]
    if config.dp_shard_enabled or config.cp_enabled:
        return config.submesh("dp_shard_cp")
    return None


def mesh_rank(state, dim: str) -> int:
    """This process's index along mesh dimension `dim` (0 when that dimension is not in use)."""
    config = getattr(state, "parallelism_config", None)
    if config is None:
        raise ConfigError(f"the {dim} rank needs a parallelism_config; pass Accelerator(parallelism_config="
                          "ParallelismConfig(...))")
    if config._sizes[dim] <= 1:
        return 0
    return state.device_mesh.get_local_rank(dim)


__all__ = ["ParallelismConfig", "TorchContextParallelConfig", "TorchPipelineParallelConfig", "TorchTensorParallelConfig",
           "TorchTensorParallelPlugin"]
