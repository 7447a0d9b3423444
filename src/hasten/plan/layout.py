"""Which backend runs the plan: the ParallelismConfig a run gets (`config_for_run`), the backend its layout needs
(`backend_for_layout`, or a one-line refusal for a layout hasten cannot run) and, with the distributed type, the
backend's REGISTRY name (`backend_to_build`). Only `make_run_plan` calls them (tests/plan/test_plan.py keeps it so)."""

from __future__ import annotations

import warnings

from ..core.enums import CP_ON_CPU, DistributedType
from ..core.errors import ConfigError, NotBuiltError

# The backend a distributed type runs on when no layout asks for another (absent: DDP on many processes).
FOR_TYPE = {DistributedType.NO: "single", DistributedType.FSDP: "fsdp", DistributedType.DEEPSPEED: "deepspeed",
            DistributedType.XLA: "xla"}
# Layout backends that run whatever the distributed type says; they shard the data dimensions with FSDP2.
LAYOUT_BACKENDS = ("pipeline", "tensor_parallel")

_SIZE_SETTINGS = ("parallelism_config_dp_replicate_size", "parallelism_config_dp_shard_size",
                  "parallelism_config_tp_size", "parallelism_config_cp_size", "parallelism_config_pp_size",
                  "parallelism_config_sp_size")


def config_for_run(config, tp_plugin=None):
    """The config an Accelerator runs with: the one passed, else one built from the environment when the launcher
    (or the user) asked for it: `--use_parallelism_config`, or any `--parallelism_config_*` size (a size given
    alone is honoured, not ignored as Accelerate ignores it without the switch). The deprecated
    `TorchTensorParallelPlugin(tp_size=n)` becomes `ParallelismConfig(tp_size=n)`, as in Accelerate."""
    from ..parallelism_config import ParallelismConfig, TorchTensorParallelPlugin

    if tp_plugin is not None:
        if not isinstance(tp_plugin, TorchTensorParallelPlugin):
            raise TypeError(f"torch_tp_plugin must be a TorchTensorParallelPlugin, got {type(tp_plugin).__name__}")
        if config is not None:
            raise ConfigError("pass either torch_tp_plugin or parallelism_config to Accelerator, not both (fix: "
                              "ParallelismConfig(tp_size=...) alone)")
        warnings.warn("TorchTensorParallelPlugin is deprecated (as in Accelerate); use "
                      "ParallelismConfig(tp_size=...)", FutureWarning, stacklevel=4)  # the caller of Accelerator()
        return ParallelismConfig(tp_size=tp_plugin.tp_size)
    if config is not None:
        return config
    from ..config.resolve import runtime_value

    asked = runtime_value("use_parallelism_config").value
    if asked or any(runtime_value(name).source != "default" for name in _SIZE_SETTINGS):
        return ParallelismConfig()
    return None


def backend_for_layout(config, num_processes: int, fsdp_plugin=None, deepspeed: bool = False,
                       device_type: str | None = None) -> str:
    """The backend that runs `config` on `num_processes` processes ("single", "ddp", "fsdp", "tensor_parallel" or
    "deepspeed"), or a one-line refusal for a layout hasten cannot run. Fits the config to the run first
    (`_validate_accelerator`)."""
    from ..parallelism_config import ParallelismConfig

    if not isinstance(config, ParallelismConfig):
        raise TypeError(f"parallelism_config must be a ParallelismConfig, got {type(config).__name__}")
    if config.sp_enabled:
        from ..distributed.sequence_parallel import check_layout

        check_layout(config, deepspeed)  # one line per layout sequence parallelism cannot run
        if not deepspeed and not config.native_sp_enabled:  # Accelerate would train plain DDP, sp dropped
            raise ConfigError(f"ParallelismConfig sp_size={config.sp_size} with sp_backend='deepspeed' needs DeepSpeed "
                              "(ALST/Ulysses); fix: enable DeepSpeed (--use_deepspeed or deepspeed_plugin=...), or "
                              "sp_backend='hasten' for hasten's Ulysses with DDP/FSDP2")
    if config.cp_enabled and device_type not in (None, "cuda"):
        raise NotBuiltError(f"ParallelismConfig cp_size={config.cp_size} on {device_type}: {CP_ON_CPU}; fix: run on "
                            "CUDA GPUs or leave cp_size at 1")
    if not (config.sp_enabled and deepspeed):  # DeepSpeed's Ulysses spans processes its own way (as Accelerate)
        config._validate_accelerator(num_processes)
    splits = config.tp_enabled or config.cp_enabled or config.pp_enabled
    if deepspeed:
        if config.dp_shard_enabled or splits or config.native_sp_enabled:
            raise ConfigError("ParallelismConfig: a DeepSpeed plugin is given, which shards by its ZeRO stage and does "
                              "not compose with dp_shard_size, tp_size, cp_size, pp_size or sp_backend='hasten'; fix: leave "
                          "them at 1 (sp with DeepSpeed: sp_backend='deepspeed')")
        return "deepspeed"
    if fsdp_plugin is not None and fsdp_plugin.fsdp_version != 2 and (config.dp_shard_enabled or splits):
        # FSDP1 HYBRID_SHARD silently diverges on CPU processes; FSDP2 composes with DTensor meshes.
        raise ConfigError(f"ParallelismConfig ({', '.join(config.active_mesh_dims)}) shards with FSDP2, but the FSDP "
                          "plugin asks for fsdp_version 1; fix: fsdp_version=2")
    if config.pp_enabled:
        if config.cp_enabled:
            raise NotBuiltError(f"ParallelismConfig pp_size={config.pp_size} with cp_size={config.cp_size}: pipeline "
                                "with context parallelism is not built in hasten yet; fix: leave cp_size at 1")
        return "pipeline"
    if splits:
        return "tensor_parallel"
    if config.dp_shard_enabled:
        return "fsdp"
    if fsdp_plugin is not None and num_processes > 1:
        raise ConfigError(f"ParallelismConfig has no dimension to shard over (dp_shard_size=1) but an FSDP plugin is "
                          f"given; fix: set dp_shard_size={num_processes} or drop the FSDP plugin")
    if fsdp_plugin is not None:
        return "fsdp"
    return "ddp" if config.dp_replicate_enabled or config.native_sp_enabled else "single"


def backend_to_build(layout: str | None, distributed_type: DistributedType, num_processes: int) -> str:
    """The REGISTRY name of the backend that runs the plan."""
    if layout in LAYOUT_BACKENDS:  # pipeline/tensor/context parallel layouts, with or without FSDP
        return layout
    if distributed_type in FOR_TYPE:
        return FOR_TYPE[distributed_type]
    return "ddp" if num_processes > 1 else "single"
