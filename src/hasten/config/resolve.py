"""One precedence for every setting, and a record of where each value came from.

    code  >  launch flag  >  environment variable  >  config file  >  built-in default

Two exceptions inside the script, as in Accelerate: a launcher's gradient_accumulation_steps replaces the
Accelerator argument, and a true HASTEN_/ACCELERATE_USE_CPU forces CPU even when the code says cpu=False.

`hasten launch` resolves flags, the user's environment and the config file, then exports the winners as
`HASTEN_*` / `FSDP_*` variables. It only exports values that came from a flag, the file or a computed
default, never over a variable the user already set, so a user's `export ACCELERATE_MIXED_PRECISION=fp16`
still beats the file. It also exports `HASTEN_CONFIG_SOURCES` (JSON: setting -> [source, origin]) so that
code inside the training processes can still tell a value from a flag apart from one from the file:

    from hasten.config.resolve import explain
    print(explain(code={"mixed_precision": "bf16"}))   # what the script passes to Accelerator(...)
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ..errors import ConfigError
from . import file as config_file

SOURCES = ("code", "flag", "environment", "file", "default")
SOURCES_VARIABLE = "HASTEN_CONFIG_SOURCES"


@dataclass(frozen=True)
class Resolved:
    """The value of one setting and where it came from."""

    name: str
    value: Any
    source: str  # one of SOURCES
    origin: str  # "--mixed_precision", "HASTEN_MIXED_PRECISION", "<file>: mixed_precision", "built-in default"


# ----------------------------------------------------------------------------------------------- parsing env text


def _parse_bool(text: str) -> bool:
    from ..environment import str_to_bool

    return str_to_bool(text, to_bool=True)


def _choice(choices) -> Callable[[str], str]:
    def parse(text: str) -> str:
        for choice in choices:
            if text.strip().lower() == str(choice).lower():
                return choice
        raise ValueError(f"expected one of {', '.join(map(str, choices))}")

    return parse


def _int(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise ValueError(f"expected a whole number of {minimum} or more")
        return value

    return parse


def _text(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


# ----------------------------------------------------------------------------------------------- the settings


@dataclass(frozen=True)
class Setting:
    """A value hasten resolves: its flag, the variables that carry it, its config-file key and default."""

    name: str
    default: Any = None
    flag: str | None = None  # argparse dest of the launch flag; None: no flag
    env: tuple = ()  # variables read inside the training processes, first one set wins
    export: str | None = None  # variable the launcher writes (None: the launcher does not export it)
    parse: Callable[[str], Any] = str
    file_key: tuple | None = None  # path into the config file, e.g. ("fsdp_config", "fsdp_version")
    help: str = ""

    @property
    def flag_text(self) -> str:
        return f"--{self.flag}"


def _pair(suffix: str) -> tuple:
    return (f"HASTEN_{suffix}", f"ACCELERATE_{suffix}")


SETTINGS: list[Setting] = [
    Setting("mixed_precision", "no", "mixed_precision", _pair("MIXED_PRECISION"), "HASTEN_MIXED_PRECISION",
            _choice(config_file.PRECISIONS), ("mixed_precision",), "autocast / loss scaling mode"),
    Setting("use_cpu", False, "cpu", _pair("USE_CPU"), "HASTEN_USE_CPU", _parse_bool, ("use_cpu",),
            "run on CPU even when accelerators are present"),
    Setting("debug", False, "debug", _pair("DEBUG_MODE"), "HASTEN_DEBUG_MODE", _parse_bool, ("debug",),
            "check shapes across ranks before collectives"),
    Setting("gradient_accumulation_steps", 1, "gradient_accumulation_steps", _pair("GRADIENT_ACCUMULATION_STEPS"),
            "HASTEN_GRADIENT_ACCUMULATION_STEPS", _int(1), None, "micro-batches per optimizer step"),
    Setting("enable_cpu_affinity", False, "enable_cpu_affinity", _pair("CPU_AFFINITY"), "HASTEN_CPU_AFFINITY",
            _parse_bool, ("enable_cpu_affinity",), "pin processes to their NUMA node"),
    Setting("dynamo_backend", "no", "dynamo_backend", _pair("DYNAMO_BACKEND"), "HASTEN_DYNAMO_BACKEND",
            _choice(config_file.DYNAMO_BACKENDS), ("dynamo_config", "dynamo_backend"), "torch.compile backend"),
    Setting("dynamo_mode", "default", "dynamo_mode", _pair("DYNAMO_MODE"), "HASTEN_DYNAMO_MODE",
            _choice(config_file.DYNAMO_MODES), ("dynamo_config", "dynamo_mode"), "torch.compile mode"),
    Setting("dynamo_use_fullgraph", False, "dynamo_use_fullgraph", _pair("DYNAMO_USE_FULLGRAPH"),
            "HASTEN_DYNAMO_USE_FULLGRAPH", _parse_bool, ("dynamo_config", "dynamo_use_fullgraph"), ""),
    Setting("dynamo_use_dynamic", None, "dynamo_use_dynamic", _pair("DYNAMO_USE_DYNAMIC"),
            "HASTEN_DYNAMO_USE_DYNAMIC", _parse_bool, ("dynamo_config", "dynamo_use_dynamic"), ""),
    Setting("dynamo_use_regional_compilation", False, "dynamo_use_regional_compilation",
            _pair("DYNAMO_USE_REGIONAL_COMPILATION"), "HASTEN_DYNAMO_USE_REGIONAL_COMPILATION", _parse_bool,
            ("dynamo_config", "dynamo_use_regional_compilation"), ""),
    Setting("use_fsdp", False, "use_fsdp", _pair("USE_FSDP"), "HASTEN_USE_FSDP", _parse_bool,
            ("distributed_type",), "shard the model with FSDP"),
    # Launch structure: read by the launcher only (SLURM variables count as the environment).
    Setting("multi_gpu", False, "multi_gpu", file_key=("distributed_type",), help="one process per GPU"),
    Setting("num_processes", None, "num_processes", parse=_int(1), file_key=("num_processes",),
            help="total processes over all machines"),
    Setting("num_machines", 1, "num_machines", parse=_int(1), file_key=("num_machines",)),
    Setting("machine_rank", 0, "machine_rank", parse=_int(0), file_key=("machine_rank",)),
    Setting("main_process_ip", None, "main_process_ip", file_key=("main_process_ip",)),
    Setting("main_process_port", None, "main_process_port", parse=_int(0), file_key=("main_process_port",)),
    Setting("rdzv_backend", "static", "rdzv_backend", file_key=("rdzv_backend",)),
    Setting("rdzv_conf", None, "rdzv_conf", file_key=("rdzv_conf",)),
    Setting("max_restarts", 0, "max_restarts", file_key=("max_restarts",)),
    Setting("monitor_interval", 0.1, "monitor_interval", file_key=("monitor_interval",)),
    Setting("same_network", False, "same_network", file_key=("same_network",)),
    Setting("gpu_ids", "all", "gpu_ids", ("CUDA_VISIBLE_DEVICES",), "CUDA_VISIBLE_DEVICES", file_key=("gpu_ids",)),
    Setting("num_cpu_threads_per_process", None, "num_cpu_threads_per_process", ("OMP_NUM_THREADS",),
            "OMP_NUM_THREADS", _int(1), ("num_cpu_threads_per_process",), "OMP_NUM_THREADS per process"),
]

# FSDP settings: exported as Accelerate's FSDP_* names for the FSDP backend (only when set: its own
# defaults apply otherwise).
FSDP_ENV = {
    "fsdp_version": "FSDP_VERSION", "fsdp_sharding_strategy": "FSDP_SHARDING_STRATEGY",
    "fsdp_reshard_after_forward": "FSDP_RESHARD_AFTER_FORWARD", "fsdp_offload_params": "FSDP_OFFLOAD_PARAMS",
    "fsdp_min_num_params": "FSDP_MIN_NUM_PARAMS", "fsdp_auto_wrap_policy": "FSDP_AUTO_WRAP_POLICY",
    "fsdp_transformer_layer_cls_to_wrap": "FSDP_TRANSFORMER_CLS_TO_WRAP",
    "fsdp_backward_prefetch": "FSDP_BACKWARD_PREFETCH", "fsdp_state_dict_type": "FSDP_STATE_DICT_TYPE",
    "fsdp_forward_prefetch": "FSDP_FORWARD_PREFETCH", "fsdp_use_orig_params": "FSDP_USE_ORIG_PARAMS",
    "fsdp_cpu_ram_efficient_loading": "FSDP_CPU_RAM_EFFICIENT_LOADING",
    "fsdp_sync_module_states": "FSDP_SYNC_MODULE_STATES",
    "fsdp_activation_checkpointing": "FSDP_ACTIVATION_CHECKPOINTING",
    "fsdp_activation_checkpointing_offload": "FSDP_ACTIVATION_CHECKPOINTING_OFFLOAD",
    "fsdp_ignored_modules": "FSDP_IGNORED_MODULES",
}


def _fsdp_parser(name: str) -> Callable[[str], Any]:
    key = config_file.NESTED_KEYS["fsdp_config"][name]

    def parse(text: str):
        value = config_file.check_value(name, text, key, lambda message: message)
        return value

    return parse


SETTINGS += [
    Setting(name, None, name if name != "fsdp_ignored_modules" else None, (variable,), variable,
            _fsdp_parser(name), ("fsdp_config", name), config_file.NESTED_KEYS["fsdp_config"][name].help)
    for name, variable in FSDP_ENV.items()
]
BY_NAME = {setting.name: setting for setting in SETTINGS}
PARADIGM_FLAGS = ("cpu", "multi_gpu", "tpu", "use_deepspeed", "use_fsdp", "use_megatron_lm")


# ----------------------------------------------------------------------------------------------- sources


def _from_file(setting: Setting, values: Mapping | None, path: str | None):
    """(value, origin) when the file sets this setting, else None."""
    if not values or setting.file_key is None:
        return None
    if setting.name in ("use_fsdp", "multi_gpu"):
        kind = values.get("distributed_type")
        if kind is None:
            return None
        wanted = "FSDP" if setting.name == "use_fsdp" else "MULTI_GPU"
        return (kind == wanted), f"{path}: distributed_type"
    node = values
    for part in setting.file_key:
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    if setting.name == "num_processes" and node == -1:
        return None  # -1 means "one per accelerator", i.e. the computed default
    if setting.file_key[0] == "fsdp_config" and values.get("distributed_type") != "FSDP":
        return None  # Accelerate leaves an fsdp block in MULTI_GPU configs; it only counts for FSDP runs
    return node, f"{path}: {'.'.join(setting.file_key)}"


def _from_env(setting: Setting, env: Mapping[str, str]):
    """(value, variable) when the environment sets this setting; a bad value is a one-line ConfigError."""
    for variable in setting.env:
        if variable in env and env[variable] != "":
            text = env[variable]
            try:
                return setting.parse(text), variable
            except (ValueError, ConfigError) as error:
                detail = str(error).split("; fix:")[0]
                raise ConfigError(
                    f"environment variable {variable}={text!r} is not valid for {setting.name} ({detail}); fix: "
                    f"`export {variable}=<valid value>` or `unset {variable}`"
                ) from None
    return None


def slurm_values(env: Mapping[str, str]) -> dict:
    """Launch structure read from a SLURM step (inside `srun`): {setting: (value, origin)}.

    One task per node: this launcher starts the node's processes and joins the others through torchrun.
    Several tasks per node: every task is one training process, so the launcher runs the script in place
    and `hasten.state` reads rank and world size from SLURM itself.
    """
    if "SLURM_PROCID" not in env or "SLURM_STEP_ID" not in env or "LOCAL_RANK" in env:
        return {}
    from ..environment import _first_slurm_host, _slurm_tasks_on_first_node

    def number(name, default):
        try:
            return int(env.get(name, default))
        except ValueError:
            raise ConfigError(f"environment variable {name}={env.get(name)!r} must be an integer (set by SLURM)") from None

    nodes = number("SLURM_STEP_NUM_NODES", number("SLURM_NNODES", 1))
    tasks = number("SLURM_STEP_NUM_TASKS", number("SLURM_NTASKS", 1))
    per_node = _slurm_tasks_on_first_node(env.get("SLURM_STEP_TASKS_PER_NODE", env.get("SLURM_TASKS_PER_NODE", "")))
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or "127.0.0.1"
    if tasks > nodes or per_node > 1:
        return {"slurm_per_task": (True, f"SLURM_NTASKS={tasks} over SLURM_NNODES={nodes}")}
    result = {
        "num_machines": (nodes, "SLURM_NNODES"),
        "machine_rank": (number("SLURM_NODEID", 0), "SLURM_NODEID"),
        "main_process_ip": (env.get("MASTER_ADDR") or _first_slurm_host(nodelist), "SLURM_STEP_NODELIST"),
    }
    gpus = env.get("SLURM_GPUS_ON_NODE")
    if gpus and gpus.isdigit() and int(gpus) > 0:
        result["num_processes"] = (int(gpus) * nodes, "SLURM_GPUS_ON_NODE x SLURM_NNODES")
    return result


def recorded_sources(env: Mapping[str, str]) -> dict:
    """The launcher's record of where the values it exported came from (empty outside `hasten launch`)."""
    text = env.get(SOURCES_VARIABLE)
    if not text:
        return {}
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return {}
    return {k: tuple(v) for k, v in data.items() if isinstance(v, list) and len(v) == 2}


def _env_overrides_code(setting: Setting, code_value, env: Mapping[str, str]) -> bool:
    """The two exceptions to "code wins", kept from Accelerate because scripts rely on them: the launcher's
    gradient accumulation steps replace the constructor argument, and a true USE_CPU variable forces CPU
    even when the code says cpu=False (it can never force CPU off)."""
    if setting.name == "gradient_accumulation_steps":
        return _from_env(setting, env) is not None
    if setting.name == "use_cpu" and not code_value:
        found = _from_env(setting, env)
        return found is not None and bool(found[0])
    return False


def resolve(
    *,
    code: Mapping[str, Any] | None = None,
    flags: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    file_values: Mapping[str, Any] | None = None,
    file_path: str | None = None,
    settings=None,
) -> dict[str, Resolved]:
    """Every setting's winning value: code > flag > environment > file > default.

    `file_values` is the checked content of the config file (keys actually present). Inside a process
    started by `hasten launch`, variables the launcher exported are reported with their first source (flag,
    file or default) from `HASTEN_CONFIG_SOURCES`.
    """
    code, flags = dict(code or {}), dict(flags or {})
    if "cpu" in code and "use_cpu" not in code:  # Accelerator(cpu=...) spells it `cpu`
        code["use_cpu"] = code.pop("cpu")
    env = os.environ if env is None else env
    recorded = recorded_sources(env)
    slurm = slurm_values(env)
    result = {}
    for setting in settings or SETTINGS:
        name = setting.name
        if name in code and code[name] is not None and not _env_overrides_code(setting, code[name], env):
            result[name] = Resolved(name, code[name], "code", f"in the script ({name}=...)")
            continue
        if setting.flag and flags.get(setting.flag) is not None:
            result[name] = Resolved(name, flags[setting.flag], "flag", setting.flag_text)
            continue
        found = _from_env(setting, env)
        if found is not None:
            value, variable = found
            source, origin = recorded.get(name, ("environment", variable))
            if source == "environment":
                origin = variable
            result[name] = Resolved(name, value, source, origin)
            continue
        if name in slurm:
            value, origin = slurm[name]
            result[name] = Resolved(name, value, "environment", origin)
            continue
        found = _from_file(setting, file_values, file_path)
        if found is not None:
            result[name] = Resolved(name, found[0], "file", found[1])
            continue
        result[name] = Resolved(name, setting.default, "default", "built-in default")
    return result


# ----------------------------------------------------------------------------------------------- reporting


def format_explanation(resolved: Mapping[str, Resolved], *, only_set: bool = False, note: str | None = None) -> str:
    """A table: setting | value | source | origin."""
    rows = [r for r in resolved.values() if not (only_set and r.source == "default")]
    rows = [(r.name, "-" if r.value is None else _text(r.value), r.source, r.origin) for r in rows]
    header = ("setting", "value", "source", "from")
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(3)]
    lines = ["  ".join(cell.ljust(widths[i]) if i < 3 else cell for i, cell in enumerate(row)) for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths) + "  " + "-" * 4)
    if note:
        lines += ["", note]
    return "\n".join(lines)


def explain(code: Mapping[str, Any] | None = None, *, env: Mapping[str, str] | None = None, printed: bool = False):
    """Inside a training script: every setting's value and source, with `code` the values passed in code.

    Returns the table as text (printed too with `printed=True`). A script run with plain `python` sees no
    config file, as in Accelerate: only `hasten launch` reads the file and passes its values on.
    """
    table = format_explanation(explain_values(code, env=env))
    if printed:
        print(table)
    return table


def explain_values(code: Mapping[str, Any] | None = None, *, env: Mapping[str, str] | None = None) -> dict:
    """The same as `explain`, as data: {setting: Resolved} for the settings a training process reads."""
    values = resolve(code=code, env=env, settings=[s for s in SETTINGS if s.export])
    if not values["use_fsdp"].value:
        values = {k: v for k, v in values.items() if not (k in FSDP_ENV and v.source == "default")}
    return values
