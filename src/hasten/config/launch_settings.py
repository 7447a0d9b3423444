"""What `hasten launch` will do, from its flags, the environment and the config file.

`resolve_launch(args)` applies the one precedence (flag > environment > file > default, see
`hasten.config.resolve`) and then, as Accelerate's launcher, lets the file and the launcher's own defaults beat
the ACCELERATE_*/FSDP_* variables the user exported (unless `environment_over_file`), rejects combinations that cannot work (conflicting flags are errors, never
warnings), and returns the variables to export to the training processes.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from typing import Mapping

from ..core.enums import CP_ON_CPU
from ..core.errors import ConfigError, LaunchError, NotBuiltError
from . import file as config_file
from . import settings as table
from .resolve import FSDP_ENV, PARADIGM_FLAGS, SETTINGS, SOURCES_VARIABLE, Resolved, _text, resolve, slurm_values


@dataclass
class LaunchSettings:
    """The resolved launch: every setting with its source, the file read, and the variables to export."""

    values: dict  # name -> Resolved
    config_path: str | None
    env: dict = field(default_factory=dict)
    rdzv_conf: dict = field(default_factory=dict)
    slurm_per_task: bool = False

    def __getitem__(self, name):
        return self.values[name].value


def parse_rdzv_conf(text: str | None, origin: str = "--rdzv_conf") -> dict:
    result = {}
    for item in filter(None, (text or "").split(",")):
        if "=" not in item or not item.split("=", 1)[0].strip():
            raise ConfigError(f"{origin} item {item!r} is not key=value; fix: e.g. --rdzv_conf timeout=900,is_host=1")
        key, value = item.split("=", 1)
        result[key.strip()] = value.strip()
    return result


def _gpu_count(strict: bool = False) -> int:
    """The GPUs torch sees. A machine with an NVIDIA device node that a CUDA build of torch cannot see (a broken
    driver, or GPUs hidden with CUDA_VISIBLE_DEVICES=) launches on the CPU, as Accelerate's launcher does, with a
    one-line warning; with `strict` it is refused."""
    import torch

    count = torch.cuda.device_count()
    if count == 0 and torch.version.cuda and os.path.exists("/dev/nvidia0"):
        problem = (f"this machine has an NVIDIA GPU (/dev/nvidia0) but torch {torch.__version__} (CUDA "
                   f"{torch.version.cuda}) sees none")
        if strict:
            raise LaunchError(f"{problem}: check the driver (nvidia-smi) and CUDA_VISIBLE_DEVICES, or pass --cpu to "
                              "launch on the CPU (strict mode)")
        _warn_once(f"hasten launch: warning: {problem}; launching on the CPU (check the driver with nvidia-smi and "
                   "CUDA_VISIBLE_DEVICES if that is not what you want)")
    return count


_WARNED = set()


def _warn_once(line: str) -> None:
    if line not in _WARNED:
        _WARNED.add(line)
        print(line, file=sys.stderr, flush=True)


def _where(resolved: Resolved) -> str:
    return {"flag": resolved.origin, "environment": f"environment {resolved.origin}",
            "file": resolved.origin, "default": "default"}.get(resolved.source, resolved.origin)


def _check_flags(args) -> None:
    """Flags that contradict each other, or ask for something hasten has not built."""
    given = [name for name in PARADIGM_FLAGS if getattr(args, name, None)]
    if len(given) > 1:
        raise ConfigError(f"--{given[0]} and --{given[1]} cannot be combined: pick one way to run")
    table.refuse_unbuilt_flags(args)
    if getattr(args, "module", False) and getattr(args, "no_python", False):
        raise ConfigError("--module and --no_python cannot be combined: -m runs `python -m`, --no_python runs no python")
    if args.cpu and args.gpu_ids is not None and args.gpu_ids != "all":
        raise ConfigError(f"--cpu and --gpu_ids {args.gpu_ids} cannot be combined: a CPU run uses no GPU")


def _check_requirements(args, values: dict) -> None:
    """A typed flag that means nothing without another setting (from a flag or the config file)."""
    for row in table.SETTINGS:
        if row.requires and row.flags and table.flag_given(args, row) and getattr(args, row.flag_dest) != row.default:
            needed = table.BY_DEST.get(row.requires) or table.get(row.requires)
            resolved = values.get(needed.name)  # a switch hasten has not built is not resolved: read the flag
            switch = resolved.value if resolved is not None else getattr(args, needed.flag_dest, None)
            if table.ignored_while_switched_off(row, getattr(args, row.flag_dest), switch not in (None, False, "no")):
                continue
            if switch in (None, False, "no"):
                example = f" {needed.example_text()}" if not needed.switch else ""
                if needed.choices and "inductor" in needed.choices:
                    example = " inductor"
                raise ConfigError(
                    f"{row.flag_text} needs {needed.flag_text} (it has no effect without {needed.flag_text}); fix: add "
                    f"e.g. {needed.flag_text}{example}"
                )


def _fp8_settings_follow_precision(values: dict) -> None:
    """fp8 settings only mean something with mixed_precision fp8: a typed one is then an error; the file's
    fp8_config block goes with the file's own mixed_precision, so it is dropped when a flag changes the precision."""
    precision = values["mixed_precision"]
    if precision.value == "fp8":
        return
    for name, resolved in list(values.items()):
        if not name.startswith("fp8_"):
            continue
        if resolved.source == "flag" and resolved.value != table.get(name).default:
            raise ConfigError(
                f"{resolved.origin} only applies to fp8 training, but mixed_precision is {precision.value!r} (from "
                f"{_where(precision)}); fix: add --mixed_precision fp8, or drop {resolved.origin}"
            )
        if resolved.source == "file":
            values[name] = Resolved(name, table.get(name).default, "default", "built-in default")


def resolve_launch(args, env: Mapping[str, str] | None = None, *, ignored_flags_fail: bool = True) -> LaunchSettings:
    """Resolve a parsed `hasten launch` command line against the environment and the config file.

    A typed flag that means nothing without its switch (`--deepspeed_config_file` without `--use_deepspeed`) is a
    ConfigError; with `ignored_flags_fail=False` (Accelerate's `_validate_launch_command`, which accepts such a
    command line) it is a warning unless `strict` is on."""
    env = os.environ if env is None else env
    _check_flags(args)
    explicit = getattr(args, "config_file", None)
    # As Accelerate: --cpu alone skips the default config file (`--config_file X --cpu` reads X)
    path = config_file.find_config_file(explicit, env) if explicit or not getattr(args, "cpu", False) else None
    file_values = None
    if path:
        file_values = config_file.validate(config_file.read_raw(path), path, fill_defaults=False, refuse_unbuilt=False)
        paradigm_typed = any(getattr(args, name, None) for name in PARADIGM_FLAGS)
        table.refuse_unbuilt_file(file_values, path, paradigm_from_flags=paradigm_typed)
        if not any(getattr(args, name, None) for name in PARADIGM_FLAGS if name != "cpu"):
            config_file.refuse_one_process_with_many(file_values, path)  # --cpu keeps the file's one-process run
    flags = vars(args)
    values = resolve(flags=flags, env=env, file_values=file_values, file_path=path)
    written = _file_over_environment(values, file_values, path)

    # A paradigm typed on the command line replaces the file's distributed_type entirely.
    if any(getattr(args, name, None) for name in PARADIGM_FLAGS):
        for name in ("use_fsdp", "multi_gpu", "use_deepspeed"):
            if values[name].source == "file":
                values[name] = Resolved(name, False, "default", "built-in default")
        if not args.use_fsdp:
            for name in FSDP_ENV:
                if values[name].source == "file":
                    values[name] = Resolved(name, None, "default", "built-in default")

    try:
        _check_requirements(args, values)
    except ConfigError as error:
        if ignored_flags_fail or values["strict"].value:
            raise
        import logging

        logging.getLogger("hasten.launch").warning("%s (`hasten launch` refuses this command line)", error)
    _fp8_settings_follow_precision(values)
    # a file value dropped above (another paradigm typed, fp8 settings without fp8) overwrites nothing
    written = _launcher_writes(values, {k: v for k, v in written.items() if values[k].source == "file"})

    slurm = slurm_values(env)
    per_task = bool(slurm.get("slurm_per_task"))
    _fill_num_processes(values, per_task, env)
    _check_values(values)
    if not per_task:
        _check_gpus_per_machine(values, env)

    rdzv = values["rdzv_conf"]
    rdzv_conf = parse_rdzv_conf(rdzv.value, "--rdzv_conf" if rdzv.source == "flag" else _where(rdzv))
    settings = LaunchSettings(values, path, rdzv_conf=rdzv_conf, slurm_per_task=per_task)
    settings.env = _exports(values, env, written)
    return settings


# What Accelerate's launcher writes into the processes' environment even when nothing set it: its own defaults for
# mixed precision and the compile backend, and, for an FSDP run, its FSDP flag defaults (so a launched script gets
# Accelerate's plugin: use_orig_params, sync_module_states and cpu_ram_efficient_loading on, min_num_params 1e8).
LAUNCHER_DEFAULTS = {"mixed_precision": "no", "dynamo_backend": "no"}
FSDP_LAUNCHER_DEFAULTS = {
    "fsdp_version": 1, "fsdp_sharding_strategy": "FULL_SHARD", "fsdp_reshard_after_forward": True,
    "fsdp_offload_params": False, "fsdp_min_num_params": 100_000_000, "fsdp_forward_prefetch": False,
    "fsdp_use_orig_params": True, "fsdp_cpu_ram_efficient_loading": True, "fsdp_sync_module_states": True,
    "fsdp_activation_checkpointing": False, "fsdp_activation_checkpointing_offload": False,
}
LAUNCHER_DEFAULT = "launcher default (as Accelerate's launcher)"


def _file_over_environment(values: dict, file_values, path) -> dict:
    """Accelerate's launcher order for the exported settings, unless `environment_over_file` is on: it merges the
    config file into its command line and writes the result over the variables the user exported, so a value
    from the file beats the user's variable (an ACCELERATE_*, FSDP_*, ... one; a HASTEN_* variable still wins). `values` is updated (`hasten config explain` names the winner).
    Returns {setting: the user's variable the launcher overwrites}."""
    from .resolve import _from_file

    written = {}
    if values["environment_over_file"].value:
        return written
    for setting in SETTINGS:
        resolved = values[setting.name]
        if not _accelerates_variable(setting, resolved):
            continue
        found = _from_file(setting, file_values, path)
        if found is None or (setting.name == "gpu_ids" and str(found[0]).lower() == "all"):
            continue  # "all" writes nothing: the user's CUDA_VISIBLE_DEVICES stays, as in Accelerate
        values[setting.name] = Resolved(setting.name, found[0], "file",
                                        f"{found[1]} (written over {resolved.origin}, as Accelerate's launcher does)")
        written[setting.name] = resolved.origin
    return written


def _accelerates_variable(setting, resolved: Resolved) -> bool:
    """The value came from a variable the user exported that Accelerate's launcher writes over (ACCELERATE_*,
    FSDP_*, CUDA_VISIBLE_DEVICES, ...). hasten's own HASTEN_* variables keep hasten's order: they beat the file."""
    return (setting.export is not None and resolved.source == "environment" and resolved.origin in setting.env
            and not resolved.origin.startswith("HASTEN_"))


def _launcher_writes(values: dict, written: dict) -> dict:
    """Add the launcher's own defaults to `written` ({setting: the user's variable overwritten, or None}): Accelerate's
    launcher writes them even when nothing set them (`LAUNCHER_DEFAULTS`, and `FSDP_LAUNCHER_DEFAULTS` for an FSDP
    run), over the user's variables unless `environment_over_file` is on."""
    defaults = dict(LAUNCHER_DEFAULTS)
    if values["use_fsdp"].value:
        defaults.update(FSDP_LAUNCHER_DEFAULTS)
    hasten_order = bool(values["environment_over_file"].value)
    for name, value in defaults.items():
        resolved = values[name]
        if _accelerates_variable(table.get(name), resolved) and not hasten_order:
            values[name] = Resolved(name, value, "default", f"{LAUNCHER_DEFAULT}, written over {resolved.origin}")
            written[name] = resolved.origin
        elif resolved.source == "default" and resolved.value is None:
            values[name] = Resolved(name, value, "default", LAUNCHER_DEFAULT)
            written[name] = None
    return written


def _layout_size(values: dict) -> int:
    """The product of the parallelism_config sizes (1 when none is set)."""
    product = 1
    for dim in ("dp_replicate", "dp_shard", "tp", "cp"):
        product *= values[f"parallelism_config_{dim}_size"].value or 1
    if values["parallelism_config_sp_backend"].value == "hasten":  # DeepSpeed's sp spans processes its own way
        product *= values["parallelism_config_sp_size"].value or 1
    return product


def _megatron_size(values: dict) -> int:
    """tp_degree x pp_degree of a Megatron-LM run (1 otherwise): data parallelism takes the rest of the processes."""
    if not values["use_megatron_lm"].value:
        return 1
    return (values["megatron_lm_tp_degree"].value or 1) * (values["megatron_lm_pp_degree"].value or 1)


def _fill_num_processes(values: dict, per_task: bool, env: Mapping[str, str]) -> None:
    current = values["num_processes"]
    if per_task:
        # Inside `srun` with one task per process: each task runs the script itself.
        if current.source == "flag":
            tasks = env.get("SLURM_NTASKS") or env.get("SLURM_STEP_NUM_TASKS")
            if tasks and int(tasks) != current.value:
                raise ConfigError(
                    f"--num_processes {current.value} disagrees with the SLURM step's {tasks} tasks; fix: drop the "
                    "flag (srun starts one process per task) or change srun's --ntasks"
                )
        values["num_processes"] = Resolved("num_processes", 1, "environment", "SLURM: one process per srun task")
        values["num_machines"] = Resolved("num_machines", 1, "environment", "SLURM: one process per srun task")
        values["machine_rank"] = Resolved("machine_rank", 0, "environment", "SLURM: one process per srun task")
        return
    layout = _layout_size(values)
    megatron = _megatron_size(values)
    if current.value is not None and current.value % megatron:
        raise ConfigError(
            f"megatron_lm tp_degree x pp_degree is {megatron} but num_processes is {current.value} (from "
            f"{_where(current)}); fix: a multiple of {megatron} processes (data parallelism takes the rest)"
        )
    if current.value is None and megatron > 1:
        values["num_processes"] = Resolved("num_processes", megatron, "default",
                                           "built-in default (megatron_lm tp_degree x pp_degree)")
        return
    if current.value is not None:
        if layout > 1 and current.value != layout:
            raise ConfigError(
                f"the parallelism_config sizes multiply to {layout} but num_processes is {current.value} (from "
                f"{_where(current)}); fix: --num_processes {layout}, or change the sizes"
            )
        return
    if layout > 1:
        values["num_processes"] = Resolved("num_processes", layout, "default",
                                           "built-in default (the product of the parallelism_config sizes)")
        return
    machines = values["num_machines"].value
    gpus = 0 if values["use_cpu"].value else _gpu_count(bool(values["strict"].value))
    if values["multi_gpu"].value:
        count, why = max(2, gpus), f"--multi_gpu: one per GPU ({gpus} found), at least 2"
    else:
        count, why = max(1, gpus) * machines, f"one per GPU ({gpus} found) on each machine, at least 1"
    values["num_processes"] = Resolved("num_processes", count, "default", f"built-in default ({why})")


def _check_gpus_per_machine(values: dict, env: Mapping[str, str]) -> None:
    """More processes on a machine than the GPUs it shows put two ranks on one GPU. Each process alone cannot
    always tell: with CUDA_VISIBLE_DEVICES=0 every process sees one GPU, as under a per-process binding, so the
    launcher, which sees the whole machine, refuses it (Accelerate's processes stop at `set_device` with
    "invalid device ordinal"). Naming a device (HASTEN_TORCH_DEVICE) shares it on purpose."""
    from .resolve import runtime_value

    v = {name: r.value for name, r in values.items()}
    if v["use_cpu"] or v["tpu"] or runtime_value("torch_device", env=env).value:
        return
    gpu_ids = v["gpu_ids"]
    named = gpu_ids is not None and str(gpu_ids).lower() != "all"
    gpus = len(str(gpu_ids).split(",")) if named else _gpu_count(bool(v["strict"]))
    per_machine = v["num_processes"] // max(1, v["num_machines"])
    if gpus == 0 or per_machine <= gpus:
        return
    shown = (f"only GPUs {gpu_ids} are visible (from {_where(values['gpu_ids'])})" if named else
             f"torch sees {gpus} GPU{'s' if gpus != 1 else ''}")
    raise ConfigError(
        f"{per_machine} processes per machine (num_processes from {_where(values['num_processes'])}) but {shown}: "
        f"two processes would share a GPU; fix: --num_processes {gpus * max(1, v['num_machines'])}, make more "
        "GPUs visible, or name the device to share with HASTEN_TORCH_DEVICE"
    )


def _check_values(values: dict) -> None:
    """Combinations that cannot work, whatever source each value came from."""
    v = {name: r.value for name, r in values.items()}
    size = values["parallelism_config_cp_size"]
    if (size.value or 1) > 1 and (v["use_cpu"] or _gpu_count(bool(v["strict"])) == 0):
        raise NotBuiltError(f"{_where(size)}: cp_size={size.value} on CPU processes: {CP_ON_CPU}; fix: launch on "
                            "CUDA GPUs or leave cp_size at 1")
    if v["use_cpu"] and v["use_fsdp"]:
        raise ConfigError(
            f"use_cpu (from {_where(values['use_cpu'])}) and use_fsdp (from {_where(values['use_fsdp'])}) cannot "
            "both be on; fix: drop one of them"
        )
    if v["multi_gpu"] and v["num_processes"] < 2:
        raise ConfigError(
            f"multi-GPU (from {_where(values['multi_gpu'])}) needs 2 or more processes but num_processes is "
            f"{v['num_processes']} (from {_where(values['num_processes'])}); fix: --num_processes 2"
        )
    machines, rank, processes = v["num_machines"], v["machine_rank"], v["num_processes"]
    if processes % machines:
        raise ConfigError(
            f"num_processes {processes} (from {_where(values['num_processes'])}) is the total over all machines and "
            f"must divide evenly by num_machines {machines} (from {_where(values['num_machines'])}); fix: use a "
            f"multiple of {machines}"
        )
    if rank >= machines:
        raise ConfigError(
            f"machine_rank {rank} (from {_where(values['machine_rank'])}) must be below num_machines {machines} "
            f"(from {_where(values['num_machines'])}); fix: use 0 to {machines - 1}"
        )
    if machines > 1 and not v["main_process_ip"]:
        raise ConfigError(
            f"num_machines {machines} (from {_where(values['num_machines'])}) needs --main_process_ip: the address "
            "of the machine with machine_rank 0"
        )
    if v["rdzv_backend"] not in config_file.RDZV_BACKENDS:
        raise ConfigError(f"rdzv_backend {v['rdzv_backend']!r} is not one of {', '.join(config_file.RDZV_BACKENDS)}")
    _check_same_network(values)
    gpu_ids = v["gpu_ids"]
    if gpu_ids is not None and str(gpu_ids).lower() != "all":
        parts = [p.strip() for p in str(gpu_ids).split(",")]
        if not all(p.isdigit() for p in parts):
            raise ConfigError(
                f"gpu_ids {gpu_ids!r} (from {_where(values['gpu_ids'])}) must be comma-separated integers such as "
                "0,1 or 'all'"
            )
    if v["fsdp_cpu_ram_efficient_loading"] and v["fsdp_sync_module_states"] is False:
        # Accelerate's launcher refuses it too (reading such a config file is fine; launching it is not)
        fix = ("`fsdp_sync_module_states: true` in " + _where(values["fsdp_sync_module_states"])
               if values["fsdp_sync_module_states"].source == "file" else "--fsdp_sync_module_states true")
        raise ConfigError(
            "When using `--fsdp_cpu_ram_efficient_loading` set `--fsdp_sync_module_states` to `True`: "
            f"fsdp_cpu_ram_efficient_loading is true but fsdp_sync_module_states is false, so ranks other than 0 "
            f"would keep empty weights; fix: {fix}"
        )


def _check_same_network(values: dict) -> None:
    """same_network, as Accelerate's launcher reads it: on several machines it hands torchrun the main address as
    master_addr/master_port instead of a rendezvous endpoint. With the static backend that is the same address
    hasten rendezvouses at; with any other backend torchrun then rendezvouses at localhost on every machine, so
    the machines never meet (a hang), and hasten refuses the combination."""
    v = {name: r.value for name, r in values.items()}
    if v["same_network"] and v["num_machines"] > 1 and v["rdzv_backend"] != "static":
        raise ConfigError(
            f"same_network (from {_where(values['same_network'])}) with rdzv_backend {v['rdzv_backend']!r} (from "
            f"{_where(values['rdzv_backend'])}) leaves torchrun without a rendezvous endpoint, so each machine would "
            "wait on itself; fix: drop same_network, or use rdzv_backend static"
        )


def default_threads(num_processes: int, num_machines: int) -> int:
    """num_cpu_threads_per_process when nothing sets it: the machine's physical cores shared among its processes
    (without a limit every process starts one thread per core and they fight for the same cores)."""
    import psutil

    per_node = max(1, num_processes // max(1, num_machines))
    return max(1, (psutil.cpu_count(logical=False) or 1) // per_node)


def _exports(values: dict, env: Mapping[str, str], written: Mapping[str, str | None] | None = None) -> dict:
    """Variables for the training processes: winners from a flag, the file, a computed default or a default the
    launcher writes (`written`: {setting: the user's variable it replaces, also overwritten, or None})."""
    exports, sources = {}, {}
    written = written or {}
    for setting in SETTINGS:
        if setting.export is None:
            continue
        resolved = values[setting.name]
        if resolved.value is None:
            continue
        if setting.requires:  # FSDP settings without FSDP, dynamo details without a backend: nothing to pass on
            needed = table.BY_DEST.get(setting.requires) or table.get(setting.requires)
            if values[needed.name].value in (None, False, "no"):
                continue
        if setting.name == "gpu_ids":
            if str(resolved.value).lower() == "all":
                continue
            value = ",".join(p.strip() for p in str(resolved.value).split(","))
        else:
            value = _text(resolved.value)
        if resolved.source != "default" or setting.name in written:
            sources[setting.name] = [resolved.source, resolved.origin]
        if resolved.source == "environment":
            continue  # the user's own variable reaches the processes unchanged
        if resolved.source == "default" and setting.name not in ("num_cpu_threads_per_process", *written):
            continue
        exports[setting.export] = value
        if written.get(setting.name):
            exports[written[setting.name]] = value  # the user's variable now says what the launcher wrote
    if values["num_cpu_threads_per_process"].value is None and "OMP_NUM_THREADS" not in env:
        threads = default_threads(values["num_processes"].value, values["num_machines"].value)
        exports["OMP_NUM_THREADS"] = str(threads)
        sources["num_cpu_threads_per_process"] = ["default", "built-in default (physical cores / processes)"]
        values["num_cpu_threads_per_process"] = Resolved(
            "num_cpu_threads_per_process", threads, "default", "built-in default (physical cores / processes)"
        )
    if values["use_cpu"].value:
        # As Accelerate's --cpu: Intel OpenMP pins each thread to one core and spins only briefly after a
        # parallel region. The user's own values win.
        for name, value in (("KMP_AFFINITY", "granularity=fine,compact,1,0"), ("KMP_BLOCKTIME", "1")):
            if name not in env:
                exports[name] = value
    exports[SOURCES_VARIABLE] = json.dumps(sources, separators=(",", ":"))
    return exports
