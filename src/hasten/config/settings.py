"""The one table of hasten's settings: every launch flag, config-file key and environment variable is a row.

A row says what a setting is called everywhere (launch flag, `HASTEN_*`/`ACCELERATE_*` variables, config-file
key, the argument of the object that uses it), what it may hold (type or enum from `hasten.core.enums`), its default,
its help text, and whether hasten has built it. From this table come:

- the `hasten launch` parser (`hasten.commands.launch.add_launch_arguments`),
- the config-file schema and its checks (`hasten.config.file`),
- the questions of `hasten config` (`hasten.commands.config.cluster`),
- the precedence code > flag > environment > file > default (`hasten.config.resolve`), which both
  `hasten config explain` and the runtime (`Accelerator`, `PartialState`, the plugins) call.

A row with `built=False` (Megatron-LM's own model options, TPU, MS-AMP, SageMaker, ...) is accepted by the parser and the
file schema so that an Accelerate command line or config file reads, and is then refused with one line naming the
feature: nothing is accepted and silently ignored. docs/configuration.md explains how to add or build a row.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Mapping

from ..core import enums
from ..core.env import parse_bool
from .setting import ParserDefault, Setting  # the row type; callers name it from here too

# ----------------------------------------------------------------------------------------------- row builders


def _pair(suffix: str) -> tuple:
    return (f"HASTEN_{suffix}", f"ACCELERATE_{suffix}")


def _exported(suffix: str, **kwargs) -> dict:
    """Read from HASTEN_<suffix> / ACCELERATE_<suffix>; the launcher writes HASTEN_<suffix>."""
    return dict(env=_pair(suffix), export=f"HASTEN_{suffix}", **kwargs)


def _not_built(feature: str, fix: str, group: str, *, built: bool = False, requires: str | None = None):
    """A builder of the rows of one feature: `built=False` rows are accepted, then refused wherever they are set.

    Building the feature is `built=True` here (or on one row); each row already names the variable the
    launcher will export (its first `env` name) and the switch it needs (`requires`).
    """

    def row(name, kind="str", *, flag=True, **kwargs) -> Setting:
        kwargs.setdefault("help", "")
        flags = kwargs.pop("flags", (f"--{name}",) if flag else ())
        if kwargs.get("env") and "export" not in kwargs:
            kwargs["export"] = kwargs["env"][0]
        if requires and name != requires:
            kwargs.setdefault("requires", requires)
        row_built = kwargs.pop("built", built)
        kwargs.setdefault("group", group)
        return Setting(name, kind, flags=flags, built=row_built, feature=feature, fix=fix, hidden=not row_built,
                       **kwargs)

    return row


_MSAMP_FIX = "use --fp8_backend ao (torchao) or te (TransformerEngine); MS-AMP is no longer maintained"
_DS_LAUNCHER_FIX = ("start the machines through torchrun as every hasten run: --num_machines, --machine_rank and "
                    "--main_process_ip on each machine (or srun)")
_DS_LAUNCHER = "DeepSpeed's own multi-node launchers (hostfile, pdsh, mpirun, ...)"
_MEGATRON_ONLY_FIX = ("hasten trains your own nn.Module with its own TP/PP/FSDP: set this in the model or leave it "
                      "unset (docs/parallelism.md, Megatron-LM settings)")
_MEGATRON_SP = ("Megatron-LM sequence parallelism (megatron_lm_sequence_parallelism)",
                "split norms and dropouts with your own tp_plan: ParallelismConfig(tp_handler=TorchTensorParallelConfig("
                "tp_plan={...: 'sequence_parallel', ...}))")
_TPU_FIX = ("hasten's pod launcher reaches every worker through `gcloud compute tpus tpu-vm ssh ... --worker all` "
            "(xla_dist's VM list is gone from torch_xla 2.x): drop the VM names")
_ND_FIX = "use --use_fsdp (data-parallel sharding), or run this job with Accelerate"
_SM_FIX = "run on a LOCAL_MACHINE (`hasten config`), or run this job with Accelerate"

_deepspeed = _not_built("DeepSpeed", "", "DeepSpeed (with --use_deepspeed)", built=True, requires="use_deepspeed")
_ds_launcher = _not_built(_DS_LAUNCHER, _DS_LAUNCHER_FIX, "DeepSpeed (with --use_deepspeed)", requires="use_deepspeed")
_DS = "DeepSpeedPlugin"
_MEGATRON_GROUP = "Megatron-LM (with --use_megatron_lm; served by hasten's TP/PP/FSDP)"
_megatron_only = _not_built("Megatron-LM's own model/optimizer option", _MEGATRON_ONLY_FIX, _MEGATRON_GROUP,
                            requires="use_megatron_lm")


def _megatron_row(name, kind, default, text, **kwargs) -> Setting:
    """A Megatron-LM setting hasten honours: flag --megatron_lm_<name>, variable MEGATRON_LM_<NAME> (Accelerate's),
    key megatron_lm_config.megatron_lm_<name>, read by `MegatronLMPlugin(<name>=...)`."""
    full = f"megatron_lm_{name}"
    return Setting(full, kind, default, flags=(f"--{full}",), env=(full.upper(),), export=full.upper(),
                   file_key=("megatron_lm_config", full), owner="MegatronLMPlugin", code=name,
                   requires="use_megatron_lm", group=_MEGATRON_GROUP, help=text, **kwargs)
_tpu = _not_built("TPU (XLA)", _TPU_FIX, "TPU", built=True)  # backends/xla, launch/tpu.py
_tpu_vm = _not_built("xla_dist's TPU VM list", _TPU_FIX, "TPU")  # the one TPU part not built


def _tpu_config(name, kind="str", **kwargs) -> Setting:
    """A config-file key of `hasten tpu-config` (no launch flag: the command has its own flags)."""
    return Setting(name, kind, file_key=(name,), role="file", owner="hasten tpu-config",
                   group="TPU pod setup (hasten tpu-config)", **kwargs)


_msamp = _not_built("MS-AMP fp8", _MSAMP_FIX, "FP8 (with --mixed_precision fp8)")
_FP8_BACKEND_UNBUILT = {"msamp": ("MS-AMP fp8 (fp8_backend msamp)", _MSAMP_FIX)}
_TE, _AO = "TERecipeKwargs", "AORecipeKwargs"
_nd = _not_built("N-D parallelism (ParallelismConfig)", _ND_FIX, "ParallelismConfig", requires="use_parallelism_config")
_MPI_GROUP = "MPI (CPU processes started by mpirun, with --mpirun_hostfile)"
_sagemaker = _not_built("Amazon SageMaker", _SM_FIX, "AWS")

_FSDP = "FullyShardedDataParallelPlugin"
_DYNAMO = "TorchDynamoPlugin"


def _fsdp(name, kind="bool", *, flag=True, variable=None, code=None, **kwargs) -> Setting:
    """An FSDP row: flag --fsdp_<name>, file key fsdp_config.fsdp_<name>, variable FSDP_<NAME> (Accelerate's)."""
    full = f"fsdp_{name}"
    variable = variable or f"FSDP_{name.upper()}"
    return Setting(full, kind, flags=(f"--{full}",) if flag else (), env=(variable,), export=variable,
                   file_key=("fsdp_config", full), owner=_FSDP, code=code or name, requires="use_fsdp",
                   group="FSDP (with --use_fsdp; exported as FSDP_* variables)", **kwargs)


def _dynamo(name, kind, code, **kwargs) -> Setting:
    full = f"dynamo_{name}"
    return Setting(full, kind, flags=(f"--{full}",), file_key=("dynamo_config", full), owner=_DYNAMO, code=code,
                   group="Resource selection", **_exported(full.upper()), **kwargs)


_TYPE_UNBUILT: dict = {}  # every distributed_type is built (XLA: backends/xla/, launch/tpu.py)
_SAGEMAKER_UNBUILT = {"AMAZON_SAGEMAKER": ("Amazon SageMaker (compute_environment AMAZON_SAGEMAKER)",
                                           "set `compute_environment: LOCAL_MACHINE`")}

# ----------------------------------------------------------------------------------------------- the table

SETTINGS: tuple[Setting, ...] = (
    # -- how the launcher runs (options, not settings) --------------------------------------------------------
    Setting("config_file", flags=("--config_file",), role="option", group="General",
            help="Config file to read (default: $HF_HOME/hasten/default_config.yaml)."),
    Setting("quiet", "bool", flags=("--quiet", "-q"), switch=True, role="option", default=False, group="General",
            help="Do not print the launcher's own error details."),
    Setting("module", "bool", flags=("--module", "-m"), switch=True, role="option", default=False, group="General",
            help="Run the target as a Python module (python -m)."),
    Setting("no_python", "bool", flags=("--no_python",), switch=True, role="option", default=False, group="General",
            help="Execute the target directly, without `python`."),
    # -- file structure ----------------------------------------------------------------------------------------
    Setting("compute_environment", "str", "LOCAL_MACHINE", file_key=("compute_environment",), role="file",
            choices=tuple(e.value for e in enums.ComputeEnvironment), unbuilt_values=_SAGEMAKER_UNBUILT,
            help="Where the run happens; hasten runs on LOCAL_MACHINE only."),
    Setting("distributed_type", "str", "NO", file_key=("distributed_type",), role="file",
            choices=tuple(e.value for e in enums.DistributedType), unbuilt_values=_TYPE_UNBUILT,
            question="Which kind of run is this machine for?",
            help="How processes share the work (NO = one process)."),
    Setting("fsdp_config", "dict", {}, file_key=("fsdp_config",), role="file", help="FSDP settings, exported as FSDP_* variables."),
    Setting("dynamo_config", "dict", {}, file_key=("dynamo_config",), role="file", help="torch.compile settings."),
    # -- general ------------------------------------------------------------------------------------------------
    Setting("debug", "bool", False, flags=("--debug",), switch=True, file_key=("debug",), owner="PartialState",
            group="General", question="Check tensor shapes across processes before collectives (debug mode)?",
            help="Check shapes across ranks before collectives.", **_exported("DEBUG_MODE")),
    Setting("collective_timeout", "float", 1800.0, flags=("--collective_timeout",), file_key=("collective_timeout",),
            minimum=1, owner="InitProcessGroupKwargs", code="timeout", group="General",
            env=("HASTEN_COLLECTIVE_TIMEOUT",), export="HASTEN_COLLECTIVE_TIMEOUT",
            help="Seconds a collective may wait before the run fails: gloo, NCCL, DeepSpeed and debug mode's hang "
                 "doctor (in code: InitProcessGroupKwargs(timeout=...)); unset, NCCL groups keep torch's 600 s "
                 "(hasten only)."),
    Setting("strict", "bool", False, flags=("--strict",), switch=True, file_key=("strict",), owner="Accelerator",
            group="General", env=("HASTEN_STRICT",), export="HASTEN_STRICT",
            help="Turn what Accelerate accepts silently or with a warning into one-line errors: a scheduler whose "
                 "optimizer was never prepared, a device map naming modules the model lacks, init_trackers called "
                 "twice, custom checkpoint files holding pickled Python objects (read with weights_only=True), "
                 "DeepSpeed plugin values DeepSpeed cannot run with (at construction, not at prepare), zero3_init_flag "
                 "below ZeRO-3, DeepSpeed's and the Accelerator's accumulation steps disagreeing, enable_async_tp, "
                 "check_reduction, FSDP1-only settings under FSDP2, sync_module_states false with "
                 "cpu_ram_efficient_loading (hasten only; off, hasten behaves as Accelerate)."),
    Setting("data_own_rng", "bool", False, flags=("--data_own_rng",), switch=True, file_key=("data_own_rng",),
            owner="prepare_data_loader", group="General", env=("HASTEN_DATA_OWN_RNG",), export="HASTEN_DATA_OWN_RNG",
            help="Give every prepared data loader generators of its own, seeded once at prepare, so iterating never "
                 "draws from torch's global RNG (hasten only; off, shuffles and worker seeds draw from it as in "
                 "Accelerate)."),
    Setting("environment_over_file", "bool", False, flags=("--environment_over_file",), switch=True,
            file_key=("environment_over_file",), env=("HASTEN_ENVIRONMENT_OVER_FILE",), group="General",
            help="Let the variables you exported (ACCELERATE_MIXED_PRECISION, FSDP_*, ...) beat the config file and "
                 "the values the launcher writes by default (hasten only; off, the launcher writes them over your "
                 "variables, as Accelerate's does)."),
    Setting("handle_preemption", "bool", False, flags=("--handle_preemption",), switch=True,
            file_key=("handle_preemption",), env=("HASTEN_HANDLE_PREEMPTION",), group="General",
            help="The launcher's side of preemption: SIGUSR1 is passed on to the workers, a run stopped by "
                 "SIGTERM/SIGUSR1 (or whose workers all exited 75) exits 75, another signal n exits 128+n, and "
                 "SIGUSR1 requeues a SLURM job (hasten only; off, as Accelerate's launcher; docs/fault_tolerance.md)."),
    Setting("hang_doctor_wait", "float", 2.0, env=("HASTEN_HANG_DOCTOR_WAIT",), minimum=0, owner="PartialState",
            help="Debug mode: seconds a rank writing the hang doctor's report waits for the others to say where "
                 "they are (hasten only)."),
    Setting("tracker_errors", "str", "propagate", env=("HASTEN_TRACKER_ERRORS",), choices=enums.TRACKER_ERROR_POLICIES,
            case="lower", owner="Accelerator.log", role="environment",
            help="What a tracker that fails in accelerator.log does: propagate (the library's exception, as in "
                 "Accelerate), warn (warn once, count later failures, report them at end_training; training goes "
                 "on) or raise (a TrackerError naming the tracker and step) (hasten only)."),
    Setting("tensorboard_one_run", "bool", False, env=("HASTEN_TENSORBOARD_ONE_RUN",), owner="TensorBoardTracker",
            role="environment",
            help="TensorBoard keeps one run per project: hyperparameters go into the run's own event file and nested "
                 "dicts are logged as parent/child scalars of that run (off: Accelerate's add_hparams and "
                 "add_scalars, each of which opens another run folder) (hasten only)."),
    Setting("staging_dir", "str", None, env=("HASTEN_STAGING_DIR",), owner="save_state", role="environment",
            help="Checkpoints in object storage (s3://, gs://, az://): the local folder where each machine stages "
                 "what a save does not stream into the store (DeepSpeed's files, a save hook's, an asynchronous "
                 "save's after the first to a root) before uploading it, and the objects of a load (default: the "
                 "temporary directory) (hasten only; docs/checkpointing.md)."),
    Setting("storage_workers", "int", 8, env=("HASTEN_STORAGE_WORKERS",), minimum=1, owner="save_state",
            role="environment",
            help="Checkpoints in object storage: how many uploads or downloads one process runs at once, and how "
                 "many 16 MiB parts of large objects it holds in memory or on the wire at once (hasten only)."),
    # -- hardware -----------------------------------------------------------------------------------------------
    Setting("use_cpu", "bool", False, flags=("--cpu",), dest="cpu", switch=True, file_key=("use_cpu",),
            owner="Accelerator", code="cpu", group="Hardware selection",
            question="Run on CPU only, even though a GPU is present?",
            help="Run on CPU even if a GPU is present.", **_exported("USE_CPU")),
    Setting("multi_gpu", "bool", False, flags=("--multi_gpu",), switch=True, distributed_type="MULTI_GPU",
            group="Hardware selection", help="Distributed run on several GPUs."),
    _tpu("tpu", "bool", switch=True, distributed_type="XLA", help="Run on TPUs."),
    # -- resources ----------------------------------------------------------------------------------------------
    Setting("mixed_precision", "str", "no", flags=("--mixed_precision",), file_key=("mixed_precision",),
            owner="Accelerator", code="mixed_precision", choices=enums.PRECISION_CHOICES,
            case="lower", group="Resource selection",
            question="Which mixed precision?", help="Mixed precision mode.", **_exported("MIXED_PRECISION")),
    Setting("num_processes", "int", None, flags=("--num_processes",), file_key=("num_processes",), minimum=1,
            file_override={"minimum": -1, "default": -1},
            group="Resource selection", question="How many processes in total, over all machines?",
            help="Total processes over all machines (default: one per GPU)."),
    Setting("num_machines", "int", 1, flags=("--num_machines",), file_key=("num_machines",), minimum=1,
            group="Resource selection", question="How many machines (nodes) take part?", help="Number of machines."),
    Setting("num_cpu_threads_per_process", "int", None, flags=("--num_cpu_threads_per_process",),
            file_key=("num_cpu_threads_per_process",), minimum=1, env=("OMP_NUM_THREADS",), export="OMP_NUM_THREADS",
            group="Resource selection", help="OMP_NUM_THREADS of each process (hasten: also a config-file key)."),
    Setting("enable_cpu_affinity", "bool", False, flags=("--enable_cpu_affinity",), switch=True,
            file_key=("enable_cpu_affinity",), owner="PartialState", group="Resource selection",
            help="Pin each process to its NUMA node's cores (a GPU process: its GPU's node; CPU processes: spread "
                 "over the nodes).", **_exported("CPU_AFFINITY")),
    Setting("dynamo_backend", "str", "no", flags=("--dynamo_backend",), file_key=("dynamo_config", "dynamo_backend"),
            owner="Accelerator", code="dynamo_backend", choices=tuple(b.value.lower() for b in enums.DynamoBackend),
            case="lower", group="Resource selection", question="Which torch.compile backend?",
            help="torch.compile backend ('no': do not compile).", **_exported("DYNAMO_BACKEND")),
    _dynamo("mode", "str", "mode", default="default", choices=enums.TORCH_DYNAMO_MODES, requires="dynamo_backend",
            question="Which mode?", help="torch.compile mode."),
    _dynamo("use_fullgraph", "bool", "fullgraph", default=False, switch=True, requires="dynamo_backend",
            question="Refuse graph breaks (fullgraph)?", help="Refuse graph breaks."),
    _dynamo("use_dynamic", "bool", "dynamic", switch=True, requires="dynamo_backend",
            question="Use dynamic shapes?", help="Dynamic shapes."),
    _dynamo("use_regional_compilation", "bool", "use_regional_compilation", default=False, switch=True,
            requires="dynamo_backend", help="Compile repeated blocks once."),
    # -- training paradigm --------------------------------------------------------------------------------------
    Setting("use_fsdp", "bool", False, flags=("--use_fsdp",), switch=True, distributed_type="FSDP",
            owner="Accelerator", group="Training paradigm", help="Shard the model with FSDP.",
            **_exported("USE_FSDP")),
    Setting("gradient_accumulation_steps", "int", 1, flags=("--gradient_accumulation_steps",), minimum=1,
            file_key=("deepspeed_config", "gradient_accumulation_steps"),
            owner="Accelerator", code="gradient_accumulation_steps", group="Training paradigm",
            question="How many micro-batches per optimizer step (gradient accumulation)?",
            help="Micro-batches per optimizer step (replaces the Accelerator argument, as in Accelerate).",
            **_exported("GRADIENT_ACCUMULATION_STEPS")),
    Setting("gradient_accumulation_normalize_by_tokens", "bool", False,
            flags=("--gradient_accumulation_normalize_by_tokens",), switch=True,
            file_key=("gradient_accumulation_normalize_by_tokens",), owner="GradientAccumulationPlugin",
            code="normalize_by_tokens", group="Training paradigm",
            help="hasten's: a window's gradient is the token-mean over all its tokens on all processes (needs "
                 "accelerator.backward(loss, num_items_in_batch=n)).",
            **_exported("GRADIENT_ACCUMULATION_NORMALIZE_BY_TOKENS")),
    _deepspeed("use_deepspeed", "bool", default=False, switch=True, distributed_type="DEEPSPEED",
               env=_pair("USE_DEEPSPEED"), export="HASTEN_USE_DEEPSPEED", owner="Accelerator", group="Training paradigm",
               help="Train with DeepSpeed ZeRO (see docs/deepspeed.md)."),
    Setting("use_megatron_lm", "bool", False, flags=("--use_megatron_lm",), switch=True, distributed_type="MEGATRON_LM",
            owner="Accelerator", group="Training paradigm",
            help="Megatron-LM's settings (--megatron_lm_*), run by hasten's own TP/PP/FSDP (docs/parallelism.md).",
            **_exported("USE_MEGATRON_LM")),
    _nd("use_parallelism_config", "bool", switch=True, env=_pair("USE_PARALLELISM_CONFIG"), built=True,
        owner="Accelerator", export="HASTEN_USE_PARALLELISM_CONFIG", help="Build a ParallelismConfig from --parallelism_config_* flags."),
    # -- distributed ----------------------------------------------------------------------------------------------
    Setting("gpu_ids", "gpu_ids", "all", flags=("--gpu_ids",), file_key=("gpu_ids",), env=("CUDA_VISIBLE_DEVICES",),
            export="CUDA_VISIBLE_DEVICES", group="Distributed GPUs", question="Which GPUs (ids) should be used?",
            help="GPUs to use: 'all' or a comma list such as '0,1'."),
    Setting("same_network", "bool", False, flags=("--same_network",), switch=True, file_key=("same_network",),
            group="Distributed GPUs", question="Are all machines on the same network?",
            help="All machines share one network: torchrun meets at --main_process_ip/--main_process_port as "
                 "master address (the static rendezvous); refused with another --rdzv_backend, where it would hang."),
    Setting("machine_rank", "int", 0, flags=("--machine_rank",), file_key=("machine_rank",), minimum=0,
            group="Distributed GPUs", help="Rank of this machine (0 for the main one)."),
    Setting("main_process_ip", "str", None, flags=("--main_process_ip",), file_key=("main_process_ip",),
            group="Distributed GPUs", question="Address (IP or host name) of the machine with rank 0",
            help="Address of the machine with rank 0."),
    Setting("main_process_port", "int", None, flags=("--main_process_port",), file_key=("main_process_port",),
            minimum=0, maximum=65535, range_text="a TCP port (0-65535)", group="Distributed GPUs",
            question="Port on the main machine", help="Port on the main machine (0: pick a free one)."),
    Setting("rdzv_backend", "str", "static", flags=("--rdzv_backend",), file_key=("rdzv_backend",),
            choices=enums.RDZV_BACKENDS, group="Distributed GPUs", question="How should the machines meet (rendezvous)?",
            help="torchrun rendezvous: static or c10d."),
    Setting("rdzv_conf", "str", None, flags=("--rdzv_conf",), file_key=("rdzv_conf",), group="Distributed GPUs",
            help="Extra rendezvous settings: key1=value1,key2=value2 (hasten: also a config-file key)."),
    Setting("tee", flags=("--tee", "-t"), role="option", default="0", hidden=True, group="Distributed GPUs",
            help="Which streams of each process to copy to the console as well as the log files."),
    Setting("log_dir", flags=("--log_dir",), role="option", group="Distributed GPUs",
            help="Directory for each process's logs."),
    Setting("role", flags=("--role",), role="option", default="default", hidden=True, group="Distributed GPUs",
            help="User-defined role of the workers (torchrun)."),
    Setting("max_restarts", "int", 0, flags=("--max_restarts",), file_key=("max_restarts",), minimum=0,
            file_override={"default": None},
            group="Distributed GPUs", help="Restarts of the whole group before failing (hasten: also a file key)."),
    Setting("monitor_interval", "float", 0.1, flags=("--monitor_interval",), file_key=("monitor_interval",),
            file_override={"default": None},
            minimum=0, group="Distributed GPUs", help="Seconds between health checks (hasten: also a file key)."),
    # -- FSDP -----------------------------------------------------------------------------------------------------
    _fsdp("version", "int", choices=enums.FSDP_VERSIONS, code="fsdp_version", question="Which FSDP?",
          help="1 = FullyShardedDataParallel, 2 = fully_shard."),
    _fsdp("offload_params", code="cpu_offload", question="Keep parameters on CPU (offload)?",
          help="Keep parameters on CPU."),
    _fsdp("min_num_params", "int", minimum=0, question="Minimum parameters per shard group",
          help="Size threshold for SIZE_BASED_WRAP."),
    _fsdp("sharding_strategy", "str", choices=enums.FSDP_SHARDING_STRATEGY, case="upper",
          help="FSDP1 sharding strategy."),
    _fsdp("reshard_after_forward", "bool_or_str", choices=enums.FSDP_SHARDING_STRATEGY,
          question="Free gathered parameters after forward (less memory, more communication)?",
          help="Free gathered parameters after forward (or an FSDP1 strategy)."),
    _fsdp("auto_wrap_policy", "str", choices=enums.FSDP_AUTO_WRAP_POLICY, case="upper",
          question="How should the model be split into shards?", help="How to split the model."),
    _fsdp("transformer_layer_cls_to_wrap", "str", variable="FSDP_TRANSFORMER_CLS_TO_WRAP",
          code="transformer_cls_names_to_wrap",
          question="Layer class names to wrap (comma-separated; blank: read from the model)",
          help="Layer class names, comma-separated."),
    _fsdp("backward_prefetch", "str", choices=enums.FSDP_BACKWARD_PREFETCH, case="upper", help="FSDP1 prefetch."),
    _fsdp("state_dict_type", "str", choices=enums.FSDP_STATE_DICT_TYPE, case="upper",
          question="How should checkpoints be saved?", help="How checkpoints are saved."),
    _fsdp("forward_prefetch", help="FSDP1 forward prefetch."),
    _fsdp("use_orig_params", help="FSDP1 use_orig_params."),
    _fsdp("cpu_ram_efficient_loading", question="Load pretrained weights on rank 0 only (saves CPU memory)?",
          help="Load weights on rank 0 only."),
    _fsdp("sync_module_states", help="Broadcast rank 0's weights at wrap time."),
    _fsdp("activation_checkpointing", question="Recompute activations in backward (activation checkpointing)?",
          help="Recompute activations in backward."),
    _fsdp("activation_checkpointing_offload", help="Offload checkpointed activations."),
    _fsdp("ignored_modules", "str", flag=False, help="Module names FSDP leaves alone (config file only)."),
    # -- environment-only knobs hasten reads -----------------------------------------------------------------------
    Setting("torch_device", "str", None, env=_pair("TORCH_DEVICE"), owner="PartialState", role="environment",
            help="Force the device (a string for torch.device)."),
    Setting("log_level", "str", None, env=_pair("LOG_LEVEL"), owner="get_logger", role="environment",
            help="Default level of hasten.logging.get_logger."),
    Setting("enable_rich", "bool", False, env=_pair("ENABLE_RICH"), owner="is_rich_available", role="environment",
            help="Let is_rich_available() say yes when rich is installed."),
    # resolved (role "setting") so the runtime reads it through runtime_value; a variable only, as in Accelerate
    Setting("bypass_device_map", "bool", False, env=_pair("BYPASS_DEVICE_MAP"), owner="Accelerator.prepare",
            help="Let prepare() take a model dispatched over several devices in a distributed run."),
    # -- DeepSpeed (DeepSpeedPlugin reads the variables; its own multi-node launchers are not built) ----------------
    Setting("deepspeed_config", "dict", {}, file_key=("deepspeed_config",), role="file",
            help="DeepSpeed settings (the keys below)."),
    _deepspeed("deepspeed_config_file", env=_pair("DEEPSPEED_CONFIG_FILE"), owner=_DS, code="hf_ds_config",
               file_key=("deepspeed_config", "deepspeed_config_file"),
               question="DeepSpeed JSON config file (blank: answer the questions below instead)",
               help="DeepSpeed JSON config file; its numbers must agree with the other DeepSpeed settings."),
    _deepspeed("zero_stage", "int", env=_pair("DEEPSPEED_ZERO_STAGE"), owner=_DS, code="zero_stage",
               choices=enums.DEEPSPEED_ZERO_STAGES, file_key=("deepspeed_config", "zero_stage"),
               question="Which ZeRO stage?", help="ZeRO stage: 0, 1, 2 (default) or 3."),
    _deepspeed("offload_optimizer_device", env=_pair("DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE"), owner=_DS,
               code="offload_optimizer_device", choices=enums.DEEPSPEED_OFFLOAD_DEVICES, case="lower",
               file_key=("deepspeed_config", "offload_optimizer_device"),
               question="Where should optimizer state be offloaded?", help="Optimizer offload device."),
    _deepspeed("offload_param_device", env=_pair("DEEPSPEED_OFFLOAD_PARAM_DEVICE"), owner=_DS,
               code="offload_param_device", choices=enums.DEEPSPEED_OFFLOAD_DEVICES, case="lower",
               file_key=("deepspeed_config", "offload_param_device"),
               question="Where should parameters be offloaded (ZeRO-3)?", help="Parameter offload device."),
    _deepspeed("offload_optimizer_nvme_path", env=_pair("DEEPSPEED_OFFLOAD_OPTIMIZER_NVME_PATH"), owner=_DS,
               code="offload_optimizer_nvme_path", file_key=("deepspeed_config", "offload_optimizer_nvme_path"),
               help="NVMe path for optimizer offload."),
    _deepspeed("offload_param_nvme_path", env=_pair("DEEPSPEED_OFFLOAD_PARAM_NVME_PATH"), owner=_DS,
               code="offload_param_nvme_path", file_key=("deepspeed_config", "offload_param_nvme_path"),
               help="NVMe path for parameter offload."),
    _deepspeed("gradient_clipping", "float", env=_pair("GRADIENT_CLIPPING"), owner=_DS, code="gradient_clipping",
               minimum=0, file_key=("deepspeed_config", "gradient_clipping"),
               question="Clip gradients to which norm (0: no clipping)?", help="DeepSpeed gradient clipping."),
    _deepspeed("zero3_init_flag", "bool", env=_pair("DEEPSPEED_ZERO3_INIT"), owner=_DS, code="zero3_init_flag",
               file_key=("deepspeed_config", "zero3_init_flag"),
               question="Build transformers models already partitioned (zero3_init_flag, ZeRO-3)?",
               help="ZeRO-3: transformers builds models partitioned (zero.Init)."),
    _deepspeed("zero3_save_16bit_model", "bool", env=_pair("DEEPSPEED_ZERO3_SAVE_16BIT_MODEL"), owner=_DS,
               code="zero3_save_16bit_model", file_key=("deepspeed_config", "zero3_save_16bit_model"),
               help="ZeRO-3: let DeepSpeed's save_16bit_model gather weights (hasten's save_model gathers them "
                    "either way)."),
    _deepspeed("deepspeed_multinode_launcher", choices=enums.DEEPSPEED_MULTINODE_LAUNCHERS,
               file_key=("deepspeed_config", "deepspeed_multinode_launcher"),
               unbuilt_values={v: (_DS_LAUNCHER, _DS_LAUNCHER_FIX)
                               for v in enums.DEEPSPEED_MULTINODE_LAUNCHERS if v != "standard"},
               help="Multi-node launcher: 'standard' (torchrun) is hasten's; the others are not built."),
    _ds_launcher("deepspeed_hostfile", file_key=("deepspeed_config", "deepspeed_hostfile"), help="Hostfile."),
    _ds_launcher("deepspeed_exclusion_filter", file_key=("deepspeed_config", "deepspeed_exclusion_filter"),
                 help="Hosts to exclude."),
    _ds_launcher("deepspeed_inclusion_filter", file_key=("deepspeed_config", "deepspeed_inclusion_filter"),
                 help="Hosts to include."),
    _deepspeed("deepspeed_moe_layer_cls_names", env=_pair("DEEPSPEED_MOE_LAYER_CLS_NAMES"), owner=_DS,
               code="transformer_moe_cls_names", file_key=("deepspeed_config", "deepspeed_moe_layer_cls_names"),
               help="MoE block classes ZeRO-3 keeps whole (comma-separated)."),
    Setting("deepspeed_allow_jit", "bool", False, env=("HASTEN_DEEPSPEED_ALLOW_JIT",), owner="DeepSpeedBackend",
            role="environment", help="On a CPU, let DeepSpeed compile its own Adam op on first use (minutes) instead of "
                                     "refusing it (hasten only)."),
    _deepspeed("config_ds_fields", flag=False, env=_pair("CONFIG_DS_FIELDS"), owner=_DS,
               help="The deepspeed_config keys of Accelerate's config file, as its launcher hands them over: with a "
                    "DeepSpeed config file, DeepSpeedPlugin refuses the ones that file would override, as Accelerate "
                    "does."),
    # -- fp8 (hasten.training.fp8; the recipe handlers in hasten.config.fp8 read these rows) -------------------------------------
    Setting("fp8_config", "dict", {}, file_key=("fp8_config",), role="file",
            help="fp8 recipe settings (the keys below), used with mixed_precision fp8."),
    *(
        Setting(f"fp8_{name}", kind, default, flags=(f"--fp8_{name}",) if key else (),
                file_key=("fp8_config", key) if key else None, file_aliases=aliases, owner=owner,
                code=code or (name if owner in (_TE, _AO) and name not in ("override_fprop", "override_dgrad",
                                                                          "override_wgrad") else None),
                group="FP8 (with --mixed_precision fp8)", switch=switch, help=text,
                **{**_exported(f"FP8_{name.upper()}"), **extra})
        for name, kind, default, key, aliases, owner, code, switch, text, extra in (
            ("backend", "str", None, "backend", (), "hasten.training.fp8", None, False,
             "fp8 library: ao (torchao) or te (TransformerEngine); default: torchao if installed, else te.",
             {"choices": enums.FP8_BACKENDS, "case": "lower", "unbuilt_values": _FP8_BACKEND_UNBUILT}),
            ("use_autocast_during_eval", "bool", False, "use_autocast_during_eval", (), _TE, None, True,
             "te: keep fp8 on in eval mode.", {}),
            ("margin", "int", 0, "margin", (), _TE, None, False, "te: scaling-factor margin.", {"minimum": 0}),
            ("interval", "int", 1, "interval", (), _TE, None, False, "te: steps between scale updates.",
             {"minimum": 1}),
            ("format", "str", "HYBRID", "fp8_format", (), _TE, "fp8_format", False,
             "te: HYBRID (E4M3 forward, E5M2 backward), E4M3 or E5M2.", {"choices": enums.FP8_FORMATS, "case": "upper"}),
            ("amax_history_len", "int", 1024, "amax_history_length", ("amax_history_len",), _TE, None, False,
             "te: amax history length.", {"minimum": 1}),
            ("amax_compute_algo", "str", "most_recent", "amax_compute_algorithm", ("amax_compute_algo",), _TE, None,
             False, "te: max or most_recent.", {"choices": enums.FP8_AMAX_COMPUTE_ALGORITHMS, "case": "lower"}),
            ("override_linear_precision", "bools3", "false,false,false", "override_linear_precision", (), _TE, None,
             False, "te: run the fprop,dgrad,wgrad matmuls in higher precision (three booleans; Accelerate passes "
             "them as FP8_OVERRIDE_FPROP/DGRAD/WGRAD).", {"env": ("HASTEN_FP8_OVERRIDE_LINEAR_PRECISION",)}),
            ("override_fprop", "bool", False, None, (), _TE, None, False,
             "te: forward matmul in higher precision.", {}),
            ("override_dgrad", "bool", False, None, (), _TE, None, False,
             "te: data-gradient matmul in higher precision.", {}),
            ("override_wgrad", "bool", False, None, (), _TE, None, False,
             "te: weight-gradient matmul in higher precision.", {}),
            ("use_mxfp8_block_scaling", "bool", False, None, (), _TE, None, False,
             "te: MXFP8 block scaling (Blackwell GPUs).", {}),
            ("enable_fsdp_float8_all_gather", "bool", True, "enable_fsdp_float8_all_gather", (), _AO, None, False,
             "ao: all-gather FSDP2 weights in float8 (used under FSDP2 only).", {}),
            ("pad_inner_dim", "bool", True, "pad_inner_dim", (), _AO, None, False,
             "ao: pad inner dimensions to multiples of 16 for the fp8 matmul.", {}),
        )
    ),
    _msamp("fp8_opt_level", choices=enums.FP8_OPTIMIZATION_LEVELS, case="upper",
           file_key=("fp8_config", "optimization_level"), file_aliases=("opt_level",),
           help="MS-AMP optimization level (MS-AMP is not supported: refused)."),
    # -- N-D parallelism (docs/parallelism.md): dp_replicate alone: DDP, dp_shard alone: FSDP2, both: HSDP, tp: tensor
    # parallelism composed with them; cp above 1 is refused on CPU (torch has no CPU rule for it) and runs on CUDA;
    # DeepSpeed sequence parallelism is not built. A size given alone turns the config on (no --use_parallelism_config).
    Setting("parallelism_config", "dict", {}, file_key=("parallelism_config",), role="file",
            prefix="parallelism_config_", feature="N-D parallelism (the parallelism_config block)", fix=_ND_FIX,
            help="N-D parallelism sizes."),
    *(
        _nd(f"parallelism_config_{name}", kind, env=(f"PARALLELISM_CONFIG_{name.upper()}",), default=default,
            file_key=("parallelism_config", f"parallelism_config_{name}"), help=text, built=True, requires=None,
            owner={"cp_comm_strategy": "TorchContextParallelConfig", "pp_schedule": "TorchPipelineParallelConfig",
                   "pp_microbatches": "TorchPipelineParallelConfig"}.get(name, "ParallelismConfig"),
            code={"pp_schedule": "schedule", "pp_microbatches": "microbatches"}.get(name, name),
            **extra)
        for name, kind, default, text, extra in (
            ("dp_replicate_size", "int", 1, "Replicated data-parallel size (alone: DDP).", {"minimum": 1}),
            ("dp_shard_size", "int", 1, "Sharded data-parallel size (alone: FSDP2).", {"minimum": 1}),
            ("tp_size", "int", 1, "Tensor-parallel size (any nn.Module: its plan or the automatic one).", {"minimum": 1}),
            ("cp_size", "int", 1, "Context-parallel size (CUDA only; refused on CPU processes).", {"minimum": 1}),
            ("pp_size", "int", 1, "Pipeline-parallel stages (hasten's; a model that is a sequence of blocks).",
             {"minimum": 1}),
            ("pp_schedule", "str", "1F1B", "Pipeline schedule (hasten's; torch.distributed.pipelining's names).",
             {"choices": enums.PP_SCHEDULES}),
            ("pp_microbatches", "int", None, "Micro-batches per pipelined batch (hasten's; unset: one per stage).",
             {"minimum": 1}),
            ("cp_backend", "str", "torch", "Context-parallel backend.", {"choices": enums.CP_BACKENDS}),
            ("cp_comm_strategy", "str", "allgather", "Context-parallel communication strategy.",
             {"choices": enums.CP_COMM_STRATEGIES}),
            ("sp_size", "int", 1, "Sequence-parallel (Ulysses) size.", {"minimum": 1}),
            ("sp_backend", "str", "deepspeed", "Sequence-parallel backend: deepspeed (ALST/Ulysses, as Accelerate) or "
             "hasten (Ulysses on the mesh, with DDP/FSDP2; docs/parallelism.md).", {"choices": enums.SP_BACKENDS}),
        )
    ),
    *(
        _nd(f"parallelism_config_{name}", kind, env=(f"PARALLELISM_CONFIG_{name.upper()}",), built=True, requires=None,
            file_key=("parallelism_config", f"parallelism_config_{name}"), help=text, owner="DeepSpeedSequenceParallelConfig")
        for name, kind, text in (
            ("sp_seq_length", "int", "Sequence length of every batch under DeepSpeed's Ulysses (with "
             "sp_seq_length_is_variable false)."),
            ("sp_seq_length_is_variable", "bool", "Whether batches' sequence lengths vary (DeepSpeed's Ulysses)."),
            ("sp_attn_implementation", "str", "Attention implementation DeepSpeed's Ulysses wraps."),
        )
    ),
    _not_built("context parallelism without FSDP (ALLOW_CP_STANDALONE)",
               "unset it and give ParallelismConfig a dp_shard_size: hasten runs cp with FSDP2", "ParallelismConfig")(
        "allow_cp_standalone", "bool", flag=False, env=_pair("ALLOW_CP_STANDALONE"),
        help="Context parallelism without FSDP."),
    # -- Megatron-LM: served natively on the one mesh (docs/parallelism.md, "Megatron-LM settings") ---------------
    Setting("megatron_lm_config", "dict", {}, file_key=("megatron_lm_config",), role="file", prefix="megatron_lm_",
            help="Megatron-LM settings, run by hasten's own TP/PP/FSDP (exported as MEGATRON_LM_* variables)."),
    *(
        _megatron_row(name, kind, default, text, **extra)
        for name, kind, default, text, extra in (
            ("tp_degree", "int", 1, "Tensor-parallel degree (becomes ParallelismConfig tp_size).", {"minimum": 1}),
            ("pp_degree", "int", 1, "Pipeline-parallel degree (becomes ParallelismConfig pp_size).", {"minimum": 1}),
            ("num_micro_batches", "int", None, "Micro-batches of each pipelined batch (the pipeline schedule's).",
             {"minimum": 1}),
            ("sequence_parallelism", "bool", False, "Megatron-LM sequence parallelism (refused when true: see the fix).",
             {"unbuilt_values": {True: _MEGATRON_SP}}),
            ("recompute_activations", "bool", False, "Recompute activations: checkpoint every block of the model.", {}),
            ("use_distributed_optimizer", "bool", False,
             "Shard optimizer state over the data-parallel ranks (FSDP2 over them: dp_shard instead of replicas).", {}),
            ("gradient_clipping", "float", 1.0, "Clip the global gradient L2 norm to this at each optimizer step "
             "(0: do not clip).", {"minimum": 0}),
        )
    ),
    *(
        _megatron_only(f"megatron_lm_{name}", kind, env=(f"MEGATRON_LM_{name.upper()}",),
                       file_key=("megatron_lm_config", f"megatron_lm_{name}"), help="Megatron-LM's own setting.")
        for name, kind in (
            ("use_custom_fsdp", "bool"), ("no_load_optim", "bool"), ("eod_mask_loss", "bool"),
            ("overlap_cpu_optimizer_d2h_h2d", "bool"), ("no_save_optim", "bool"), ("optimizer_cpu_offload", "bool"),
            ("use_precision_aware_optimizer", "bool"), ("decoder_last_pipeline_num_layers", "int"),
            ("recompute_granularity", "str"), ("recompute_method", "str"), ("recompute_num_layers", "int"),
            ("attention_backend", "bool"), ("expert_model_parallel_size", "int"), ("context_parallel_size", "int"),
            ("attention_dropout", "float"), ("hidden_dropout", "float"), ("attention_softmax_in_fp32", "bool"),
            ("expert_tensor_parallel_size", "int"), ("calculate_per_token_loss", "bool"),
            ("use_rotary_position_embeddings", "bool"),
        )
    ),
    # -- TPU (torch_xla: backends/xla/, launch/tpu.py) -------------------------------------------------------------
    _tpu("tpu_use_cluster", "bool", default=False, flags=("--tpu_cluster",), switch=True,
         file_key=("tpu_use_cluster",), help="Use a TPU pod."),
    _tpu("no_tpu_cluster", "bool", switch=True, help="Do not use a TPU pod."),
    _tpu("tpu_use_sudo", "bool", default=False, switch=True, file_key=("tpu_use_sudo",), help="sudo on TPU workers."),
    _tpu_vm("vm", "list", append=True, help="TPU VM names."),
    _tpu("env", "list", append=True, help="Environment variables for TPU workers."),
    _tpu_vm("tpu_vm", "str_or_list", flag=False, file_key=("tpu_vm",), help="TPU VM names."),
    _tpu("tpu_env", "str_or_list", flag=False, file_key=("tpu_env",), help="TPU environment."),
    _tpu("main_training_function", default="main", file_key=("main_training_function",),
         help="Function a TPU launch calls."),
    _tpu("downcast_bf16", "bool", default=False, switch=True, file_key=("downcast_bf16",),
         env=_pair("DOWNCAST_BF16"), help="TPU bf16 downcasting."),
    # read by `hasten tpu-config` only (it composes a gcloud command), so they are built whatever the machine
    _tpu_config("tpu_name", help="TPU name `hasten tpu-config` runs the commands on (its --tpu_name wins)."),
    _tpu_config("tpu_zone", help="Zone of that TPU (`hasten tpu-config --tpu_zone` wins)."),
    _tpu_config("command_file", help="File of commands `hasten tpu-config` runs on every TPU worker, one a line."),
    _tpu_config("commands", "str_or_list", help="Commands `hasten tpu-config` runs on every TPU worker."),
    _tpu("in_tpu_pod", "bool", flag=False, env=_pair("IN_TPU_POD"), help="Set inside a TPU pod launch."),
    # -- mpirun (built: hasten.launch.mpirun) and SageMaker (not built) ------------------------------------------------
    Setting("mpirun_config", "dict", {}, file_key=("mpirun_config",), role="file",
            help="mpirun settings: CPU processes started by mpirun/mpiexec instead of torchrun."),
    Setting("mpirun_hostfile", "str", None, flags=("--mpirun_hostfile",), file_key=("mpirun_config", "mpirun_hostfile"),
            group=_MPI_GROUP,
            help="Start the CPU processes with mpirun (Intel MPI, MPICH, MVAPICH: -f; Open MPI: --hostfile) and this "
                 "hostfile, instead of torchrun."),
    Setting("mpirun_ccl", "int", None, flags=("--mpirun_ccl",), file_key=("mpirun_config", "mpirun_ccl"), minimum=1,
            env=("CCL_WORKER_COUNT",), export="CCL_WORKER_COUNT", requires="mpirun_hostfile", group=_MPI_GROUP,
            help="oneCCL worker threads per process (CCL_WORKER_COUNT) of an mpirun launch."),
    _sagemaker("aws_access_key_id", help="AWS key id."),
    _sagemaker("aws_secret_access_key", help="AWS secret key."),
    _sagemaker("use_sagemaker", "bool", flag=False, env=_pair("USE_SAGEMAKER"), help="Set by the SageMaker launcher."),
    _sagemaker("sagemaker_distributed_type", flag=False, env=_pair("SAGEMAKER_DISTRIBUTED_TYPE"),
               choices=tuple(e.value for e in enums.SageMakerDistributedType), help="SageMaker data/model parallel."),
)

BY_NAME: dict[str, Setting] = {row.name: row for row in SETTINGS}
BY_DEST: dict[str, Setting] = {row.flag_dest: row for row in SETTINGS if row.flags}
if len(BY_NAME) != len(SETTINGS):  # pragma: no cover - a table edit that repeats a name
    raise RuntimeError("hasten.config.settings: two rows share a name")

# Flags that choose how to run; at most one may be given.
PARADIGM_FLAGS = ("cpu", "multi_gpu", "tpu", "use_deepspeed", "use_fsdp", "use_megatron_lm")


def get(name: str) -> Setting:
    return BY_NAME[name]


def resolvable() -> list[Setting]:
    """Rows whose value `hasten config explain` reports and the precedence resolves."""
    return [row for row in SETTINGS if row.built and row.role == "setting"]


@functools.lru_cache(maxsize=None)
def file_rows() -> tuple[dict, dict]:
    """{top-level key: row} and {block: {key: row}} of the config file, from the table (built once)."""
    top, nested = {}, {}
    for row in SETTINGS:
        if not row.file_key:
            continue
        row = replace(row, **row.file_override) if row.file_override else row
        if len(row.file_key) == 1:
            top[row.file_key[0]] = row
        else:
            block, key = row.file_key
            nested.setdefault(block, {})[key] = row
            for alias in row.file_aliases:
                nested[block][alias] = replace(row, file_key=(block, alias))
    return top, nested


# What an untyped flag reads on the parsed command line where Accelerate's parser has a default that code reads
# (Accelerate's tests check it); every other settings flag reads None. Either way it counts as not typed.
PARSER_DEFAULTS = {"fsdp_sync_module_states": ParserDefault("true")}


def flag_given(args, row: Setting) -> bool:
    """Whether the command line set this row's flag (flags default to None or a ParserDefault: "not typed")."""
    value = getattr(args, row.flag_dest, None)
    return value is not None and value is not False and value != [] and not isinstance(value, ParserDefault)


# Values a flag may carry while the switch it `requires` is off, because Accelerate's launch parser fills them in
# (or Accelerate's own tests write them into a hand-made Namespace) and Accelerate reads none of them then. They ask
# for nothing, so they are neither refused as not built nor as needing their switch.
IGNORED_WHILE_SWITCHED_OFF = {
    "megatron_lm_tp_degree": (1,), "megatron_lm_pp_degree": (1,), "megatron_lm_gradient_clipping": (1.0,),
    "fsdp_min_num_params": (0, 100_000_000),
}


def ignored_while_switched_off(row: Setting, value, switch_value) -> bool:
    """Whether `value` of `row` is one of Accelerate's fill-ins and the switch it requires is off."""
    return bool(row.requires) and not switch_value and value in IGNORED_WHILE_SWITCHED_OFF.get(row.name, ())


def refuse_unbuilt_flags(args) -> None:
    """One line for the first flag of a feature hasten has not built (or a value of a built flag it has not)."""
    for row in SETTINGS:
        if not row.flags or row.role == "option":
            continue
        if not flag_given(args, row):
            continue
        value = getattr(args, row.flag_dest)
        if ignored_while_switched_off(row, value, getattr(args, row.requires or "", None)):
            continue
        row.refuse(row.flag_text, value)


def refuse_unbuilt_file(values: Mapping | None, path: str | None, *, paradigm_from_flags: bool = False) -> None:
    """One line for the first key of a checked config file that asks for something hasten has not built.

    With `paradigm_from_flags` (--cpu, --multi_gpu, --use_fsdp typed), the file's distributed_type and its blocks
    are replaced by the command line, so they cannot ask for anything.
    """
    if not values:
        return
    top, nested = file_rows()
    for key, value in values.items():
        row = top.get(key)
        if row is None or paradigm_from_flags and (key == "distributed_type" or row.kind == "dict"):
            continue
        if row.kind == "dict" and isinstance(value, Mapping):
            for inner, inner_value in value.items():
                inner_row = nested.get(key, {}).get(inner)
                where = f"{path}: {key}.{inner}"
                if inner_row is None:  # a prefixed block (megatron_lm_config, parallelism_config)
                    if value and not row.built:
                        row.refuse(where)
                    continue
                if inner_row.is_set(inner_value) or not row.built and inner_value is not None:
                    inner_row.refuse(where, inner_value)
            if value and not row.built:
                row.refuse(f"{path}: {key}")
            continue
        if row.is_set(value) or row.choices:
            row.refuse(f"{path}: {key}", value)


def refuse_unbuilt_environment(env: Mapping[str, str]) -> None:
    """Inside the script: a variable of a feature hasten has not built, or a value it has not built, is refused."""
    for row in SETTINGS:
        for variable in row.env:
            text = env.get(variable)
            if text is None or text == "":
                continue
            if not row.built:
                try:
                    on = parse_bool(text) if row.kind == "bool" else True
                except ValueError:
                    on = True
                if on:
                    row.refuse(f"environment variable {variable}={text!r}")
            elif row.unbuilt_values:
                try:
                    value = row.convert(text)
                except ValueError:
                    continue  # a bad value is reported where the setting is read, with its own message
                row.refuse(f"environment variable {variable}={text!r}", value)
            break
