"""The config file: where it lives, which keys it may hold, and reading/writing it with clear errors.

The keys are Accelerate's (`accelerate config` files load unchanged), plus a few launch settings that
Accelerate only takes as flags (`rdzv_conf`, `max_restarts`, `monitor_interval`,
`num_cpu_threads_per_process`). A file is checked once, when it is read: an unknown key, a value of the
wrong type or an impossible combination is a `ConfigFileError` naming the file, the key, the value, what
is allowed, and the fix.
"""

from __future__ import annotations

import difflib
import json
import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ..errors import ConfigError

DEFAULT_CONFIG_NAME = "default_config.yaml"


class ConfigFileError(ConfigError):
    """A config file is missing, unreadable, or holds a bad key or value."""


# ----------------------------------------------------------------------------------------------- locations


def hf_home(env: Mapping[str, str] | None = None) -> str:
    """`$HF_HOME`, else `${XDG_CACHE_HOME:-~/.cache}/huggingface` (the Hugging Face cache folder)."""
    env = os.environ if env is None else env
    if env.get("HF_HOME"):
        return os.path.expanduser(env["HF_HOME"])
    cache = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(os.path.expanduser(cache), "huggingface")


def default_config_path(env: Mapping[str, str] | None = None) -> str:
    """Where `hasten config` writes and `hasten launch` looks first: `$HF_HOME/hasten/default_config.yaml`."""
    return os.path.join(hf_home(env), "hasten", DEFAULT_CONFIG_NAME)


def accelerate_config_path(env: Mapping[str, str] | None = None) -> str:
    """An existing Accelerate config, read when hasten has none of its own."""
    folder = os.path.join(hf_home(env), "accelerate")
    yaml_path = os.path.join(folder, DEFAULT_CONFIG_NAME)
    json_path = os.path.join(folder, "default_config.json")
    return json_path if not os.path.isfile(yaml_path) and os.path.isfile(json_path) else yaml_path


def find_config_file(explicit: str | None = None, env: Mapping[str, str] | None = None) -> str | None:
    """The file to read: `explicit` (must exist), else hasten's default, else Accelerate's default, else None."""
    if explicit:
        if not os.path.isfile(explicit):
            raise ConfigFileError(
                f"config file {explicit!r} does not exist; create it with `hasten config --config_file {explicit}` "
                "or pass an existing file"
            )
        return explicit
    for path in (default_config_path(env), accelerate_config_path(env)):
        if os.path.isfile(path):
            return path
    return None


# ----------------------------------------------------------------------------------------------- schema


@dataclass(frozen=True)
class Key:
    """One key of the file: its type, default, allowed values and a one-line meaning (for docs and errors)."""

    kind: str  # "str", "int", "float", "bool", "dict", "list", "gpu_ids", "bool_or_str", "str_or_list"
    default: Any = None
    choices: tuple | None = None
    minimum: float | None = None
    maximum: float | None = None
    help: str = ""
    example: str = ""


DISTRIBUTED_TYPES = (
    "NO", "MULTI_CPU", "MULTI_GPU", "MULTI_NPU", "MULTI_MLU", "MULTI_SDAA", "MULTI_MUSA", "MULTI_XPU", "MULTI_HPU",
    "MULTI_NEURON", "FSDP", "DEEPSPEED", "XLA", "MEGATRON_LM",
)
PRECISIONS = ("no", "fp16", "bf16", "fp8")
DYNAMO_BACKENDS = (
    "no", "eager", "aot_eager", "inductor", "aot_ts_nvfuser", "nvprims_nvfuser", "cudagraphs", "ofi", "fx2trt",
    "onnxrt", "tensorrt", "aot_torchxla_trace_once", "torchxla_trace_once", "tvm",
)
DYNAMO_MODES = ("default", "reduce-overhead", "max-autotune")
RDZV_BACKENDS = ("static", "c10d", "etcd", "etcd-v2")
FSDP_SHARDING_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2")
FSDP_AUTO_WRAP_POLICIES = ("TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP")
FSDP_BACKWARD_PREFETCH = ("BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH")
FSDP_STATE_DICT_TYPES = ("FULL_STATE_DICT", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT")

TOP_KEYS: dict[str, Key] = {
    "compute_environment": Key("str", "LOCAL_MACHINE", ("LOCAL_MACHINE", "AMAZON_SAGEMAKER"),
                               help="Where the run happens; hasten runs on LOCAL_MACHINE only."),
    "distributed_type": Key("str", "NO", DISTRIBUTED_TYPES,
                            help="How processes share the work (NO = one process)."),
    "mixed_precision": Key("str", "no", PRECISIONS, help="Mixed precision mode."),
    "use_cpu": Key("bool", False, help="Run on CPU even when a GPU is present."),
    "debug": Key("bool", False, help="Check tensor shapes across ranks before collectives."),
    "num_processes": Key("int", -1, minimum=-1, help="Total processes over all machines (-1: one per GPU)."),
    "num_machines": Key("int", 1, minimum=1, help="Number of machines."),
    "machine_rank": Key("int", 0, minimum=0, help="Rank of this machine (0 for the main one)."),
    "gpu_ids": Key("gpu_ids", "all", help="GPUs to use: 'all' or a comma list such as '0,1'."),
    "main_process_ip": Key("str", None, help="Address of the machine with rank 0 (multi-machine runs)."),
    "main_process_port": Key("int", None, minimum=0, maximum=65535, help="Port on the main machine (0 = any free)."),
    "rdzv_backend": Key("str", "static", RDZV_BACKENDS, help="torchrun rendezvous: static or c10d."),
    "same_network": Key("bool", False, help="All machines share one network."),
    "main_training_function": Key("str", "main", help="TPU only (accepted for compatibility)."),
    "enable_cpu_affinity": Key("bool", False, help="Pin each process to its NUMA node's cores."),
    "downcast_bf16": Key("bool", False, help="TPU only (accepted for compatibility)."),
    "fp8_config": Key("dict", {}, help="FP8 recipe settings."),
    "deepspeed_config": Key("dict", {}, help="DeepSpeed settings (hasten does not run DeepSpeed yet)."),
    "fsdp_config": Key("dict", {}, help="FSDP settings, exported as FSDP_* variables."),
    "parallelism_config": Key("dict", {}, help="N-D parallelism sizes (accepted; not used yet)."),
    "megatron_lm_config": Key("dict", {}, help="Megatron-LM settings (not supported)."),
    "mpirun_config": Key("dict", {}, help="mpirun settings (not supported)."),
    "dynamo_config": Key("dict", {}, help="torch.compile settings."),
    "tpu_name": Key("str", None, help="TPU only."),
    "tpu_zone": Key("str", None, help="TPU only."),
    "tpu_use_cluster": Key("bool", False, help="TPU only."),
    "tpu_use_sudo": Key("bool", False, help="TPU only."),
    "command_file": Key("str", None, help="TPU only."),
    "commands": Key("str_or_list", None, help="TPU only."),
    "tpu_vm": Key("str_or_list", None, help="TPU only."),
    "tpu_env": Key("str_or_list", None, help="TPU only."),
    # hasten additions: launch settings Accelerate takes only as flags.
    "rdzv_conf": Key("str", None, help="Extra rendezvous settings, key=value,key=value (hasten only)."),
    "max_restarts": Key("int", None, minimum=0, help="Restarts of the whole group before failing (hasten only)."),
    "monitor_interval": Key("float", None, minimum=0, help="Seconds between health checks (hasten only)."),
    "num_cpu_threads_per_process": Key("int", None, minimum=1, help="OMP_NUM_THREADS per process (hasten only)."),
}

# Legacy keys that `load` rewrites into their current form.
LEGACY_KEYS = {"fp16": Key("bool", None), "dynamo_backend": Key("str", None, DYNAMO_BACKENDS)}

NESTED_KEYS: dict[str, dict[str, Key]] = {
    "fsdp_config": {
        "fsdp_version": Key("int", None, (1, 2), help="1 = FullyShardedDataParallel, 2 = fully_shard."),
        "fsdp_reshard_after_forward": Key("bool_or_str", None, FSDP_SHARDING_STRATEGIES,
                                          help="Free gathered parameters after forward (or an FSDP1 strategy)."),
        "fsdp_sharding_strategy": Key("str", None, FSDP_SHARDING_STRATEGIES, help="FSDP1 sharding strategy."),
        "fsdp_offload_params": Key("bool", None, help="Keep parameters on CPU."),
        "fsdp_auto_wrap_policy": Key("str", None, FSDP_AUTO_WRAP_POLICIES, help="How to split the model."),
        "fsdp_transformer_layer_cls_to_wrap": Key("str", None, help="Layer class names, comma-separated."),
        "fsdp_min_num_params": Key("int", None, minimum=0, help="Size threshold for SIZE_BASED_WRAP."),
        "fsdp_backward_prefetch": Key("str", None, FSDP_BACKWARD_PREFETCH, help="FSDP1 prefetch."),
        "fsdp_state_dict_type": Key("str", None, FSDP_STATE_DICT_TYPES, help="How checkpoints are saved."),
        "fsdp_forward_prefetch": Key("bool", None, help="FSDP1 forward prefetch."),
        "fsdp_use_orig_params": Key("bool", None, help="FSDP1 use_orig_params."),
        "fsdp_cpu_ram_efficient_loading": Key("bool", None, help="Load weights on rank 0 only."),
        "fsdp_sync_module_states": Key("bool", None, help="Broadcast rank 0's weights at wrap time."),
        "fsdp_activation_checkpointing": Key("bool", None, help="Recompute activations in backward."),
        "fsdp_activation_checkpointing_offload": Key("bool", None, help="Offload checkpointed activations."),
        "fsdp_ignored_modules": Key("str", None, help="Module names FSDP leaves alone."),
    },
    "deepspeed_config": {
        name: Key("any") for name in (
            "deepspeed_config_file", "zero_stage", "offload_optimizer_device", "offload_param_device",
            "offload_optimizer_nvme_path", "offload_param_nvme_path", "gradient_accumulation_steps",
            "gradient_clipping", "zero3_init_flag", "zero3_save_16bit_model", "deepspeed_multinode_launcher",
            "deepspeed_hostfile", "deepspeed_exclusion_filter", "deepspeed_inclusion_filter",
            "deepspeed_moe_layer_cls_names",
        )
    },
    "dynamo_config": {
        "dynamo_backend": Key("str", "no", DYNAMO_BACKENDS, help="torch.compile backend."),
        "dynamo_mode": Key("str", "default", DYNAMO_MODES, help="torch.compile mode."),
        "dynamo_use_fullgraph": Key("bool", False, help="Refuse graph breaks."),
        "dynamo_use_dynamic": Key("bool", None, help="Dynamic shapes."),
        "dynamo_use_regional_compilation": Key("bool", False, help="Compile repeated blocks once."),
    },
    "fp8_config": {
        name: Key("any") for name in (
            "backend", "use_autocast_during_eval", "margin", "interval", "fp8_format", "amax_history_length",
            "amax_history_len", "amax_compute_algorithm", "amax_compute_algo", "override_linear_precision",
            "optimization_level", "opt_level", "enable_fsdp_float8_all_gather", "pad_inner_dim",
            "use_mxfp8_block_scaling",
        )
    },
    "mpirun_config": {"mpirun_hostfile": Key("str"), "mpirun_ccl": Key("any")},
}
# These nested blocks accept any key with their prefix (as Accelerate does).
NESTED_PREFIXES = {"megatron_lm_config": "megatron_lm_", "parallelism_config": "parallelism_config_"}


# ----------------------------------------------------------------------------------------------- checking


def _kind_text(key: Key) -> str:
    if key.kind == "bool_or_str":
        return "true or false (or an FSDP1 strategy: " + ", ".join(key.choices) + ")"
    if key.choices:
        return "one of " + ", ".join(str(c) for c in key.choices)
    text = {
        "int": "a whole number", "float": "a number", "bool": "true or false", "str": "a string",
        "dict": "a mapping of keys to values", "gpu_ids": "'all' or comma-separated GPU ids such as '0,1'",
        "bool_or_str": "true or false", "str_or_list": "a string or a list of strings", "list": "a list",
    }.get(key.kind, "a value")
    if key.minimum is not None and key.maximum is not None:
        text += f" from {key.minimum:g} to {key.maximum:g}"
    elif key.minimum is not None:
        text += f" of {key.minimum:g} or more"
    return text


def _suggest(name: str, allowed) -> str:
    close = difflib.get_close_matches(name, list(allowed), n=1)
    return f"did you mean {close[0]!r}? " if close else ""


def check_value(name: str, value: Any, key: Key, where: Callable[[str], str]) -> Any:
    """`value` converted to the key's type, or a ConfigFileError built by `where(message)`."""

    def bad(fix: str = ""):
        fix = fix or f"write `{name}: {key.example or _example(key)}`"
        return ConfigFileError(where(f"key {name!r} has value {value!r}; expected {_kind_text(key)}; fix: {fix}"))

    if value is None:
        return None
    kind = key.kind
    if kind == "any":
        return value
    if kind == "bool_or_str":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        if isinstance(value, str) and value.strip().upper() in (key.choices or ()):
            return value.strip().upper()
        raise bad()
    if kind == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false", "yes", "no"):
            return value.strip().lower() in ("true", "yes")
        raise bad()
    if kind in ("int", "float"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            if isinstance(value, str):
                try:
                    value = int(value) if kind == "int" else float(value)
                except ValueError:
                    raise bad() from None
            else:
                raise bad()
        if kind == "int":
            if isinstance(value, float) and not value.is_integer():
                raise bad()
            value = int(value)
        else:
            value = float(value)
        if key.minimum is not None and value < key.minimum or key.maximum is not None and value > key.maximum:
            raise bad()
        if key.choices and value not in key.choices:
            raise bad()
        return value
    if kind == "gpu_ids":
        text = ",".join(str(v) for v in value) if isinstance(value, list) else str(value)
        text = text.replace(" ", "")
        if text.lower() == "all":
            return "all"
        if not text or not all(part.isdigit() for part in text.split(",")):
            raise bad()
        return text
    if kind == "dict":
        if value == "" or value == []:
            return {}
        if not isinstance(value, dict):
            raise bad(f"write `{name}:` followed by indented `key: value` lines, or `{name}: {{}}`")
        return value
    if kind == "str_or_list":
        if isinstance(value, str) or isinstance(value, list) and all(isinstance(v, str) for v in value):
            return value
        raise bad()
    # kind == "str"
    if value is False and key.choices and any(str(c).lower() == "no" for c in key.choices):
        value = "no"  # YAML 1.1 reads an unquoted NO as false (`distributed_type: NO`, `mixed_precision: no`)
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
        raise bad()
    value = str(value)
    if key.choices:
        for choice in key.choices:
            if value.lower() == str(choice).lower():
                return choice
        close = difflib.get_close_matches(value.upper() if value.isupper() else value, [str(c) for c in key.choices], n=1)
        raise bad(f"write `{name}: {close[0] if close else key.choices[0]}`")
    return value


def _example(key: Key) -> str:
    if key.choices:
        return str(key.choices[0])
    return {"int": "1" if key.minimum in (None, 0, 1) else str(int(key.minimum)), "float": "0.1", "bool": "true",
            "str": "<text>", "gpu_ids": "all", "bool_or_str": "true", "str_or_list": "<text>"}.get(key.kind, "...")


def validate(raw: Mapping[str, Any], source: str = "<config>", *, fill_defaults: bool = True) -> dict:
    """Check a parsed config mapping; return it normalised (types fixed, legacy keys rewritten, and with
    `fill_defaults` the missing keys filled in; without it only the keys the file really sets)."""
    if not isinstance(raw, Mapping):
        raise ConfigFileError(
            f"{source}: the file must hold `key: value` lines (a mapping), not {type(raw).__name__}; "
            "fix: regenerate it with `hasten config`"
        )

    def where(message):
        return f"{source}: {message}"

    raw = dict(raw)
    # Legacy spellings from older Accelerate versions.
    if "fp16" in raw:
        fp16 = check_value("fp16", raw.pop("fp16"), LEGACY_KEYS["fp16"], where)
        if fp16 and "mixed_precision" not in raw:
            raw["mixed_precision"] = "fp16"
    if "dynamo_backend" in raw:
        backend = check_value("dynamo_backend", raw.pop("dynamo_backend"), LEGACY_KEYS["dynamo_backend"], where)
        dynamo = raw.setdefault("dynamo_config", {}) or {}
        if isinstance(dynamo, dict):
            dynamo.setdefault("dynamo_backend", backend)
            raw["dynamo_config"] = dynamo

    config = {}
    for name, value in raw.items():
        key = TOP_KEYS.get(name)
        if key is None:
            if name in _SAGEMAKER_KEYS:
                raise ConfigFileError(where(
                    f"key {name!r} belongs to an Amazon SageMaker config, which hasten does not run; "
                    "fix: use a LOCAL_MACHINE config (`hasten config`)"
                ))
            raise ConfigFileError(where(
                f"unknown key {name!r}; {_suggest(str(name), TOP_KEYS)}allowed keys are listed in "
                "docs/configuration.md; fix: remove or rename it"
            ))
        config[name] = check_value(name, value, key, where)
        if key.kind == "dict" and config[name]:
            config[name] = _validate_nested(name, config[name], where)

    present = {k: v for k, v in config.items() if v is not None}
    for name, key in TOP_KEYS.items():
        if config.get(name) is None and key.default is not None:
            config[name] = dict(key.default) if isinstance(key.default, dict) else key.default
    if config["distributed_type"] == "NO" and config["num_processes"] == -1:
        config["num_processes"] = 1
    _check_combinations(config, raw, where)
    return config if fill_defaults else present


_SAGEMAKER_KEYS = {
    "ec2_instance_type", "iam_role_name", "image_uri", "profile", "region", "base_job_name", "pytorch_version",
    "transformers_version", "py_version", "sagemaker_inputs_file", "sagemaker_metrics_file", "additional_args",
}


def _validate_nested(block: str, values: dict, where) -> dict:
    result = {}
    known = NESTED_KEYS.get(block)
    prefix = NESTED_PREFIXES.get(block)
    for name, value in values.items():
        full = f"{block}.{name}"
        if prefix is not None:
            if not str(name).startswith(prefix):
                raise ConfigFileError(where(
                    f"unknown key {full!r}; keys of {block} start with {prefix!r}; fix: rename it to {prefix}{name}"
                ))
            result[name] = value
            continue
        # Accelerate writes fsdp keys with or without their prefix, and dynamo keys likewise.
        lookup = name
        if block == "fsdp_config" and not str(name).startswith("fsdp_") and "fsdp_" + str(name) in known:
            lookup = "fsdp_" + str(name)
        if block == "dynamo_config" and not str(name).startswith("dynamo_") and "dynamo_" + str(name) in known:
            lookup = "dynamo_" + str(name)
        key = known.get(lookup)
        if key is None:
            raise ConfigFileError(where(
                f"unknown key {full!r}; {_suggest(str(name), known)}allowed: {', '.join(known)}; fix: remove or rename it"
            ))
        result[lookup] = check_value(f"{block}.{lookup}", value, key, where)
    return result


def _check_combinations(config: dict, raw: Mapping, where) -> None:
    def fail(message):
        raise ConfigFileError(where(message))

    if config["compute_environment"] == "AMAZON_SAGEMAKER":
        fail("compute_environment AMAZON_SAGEMAKER is not supported by hasten; fix: set "
             "`compute_environment: LOCAL_MACHINE`")
    machines, rank = config["num_machines"], config["machine_rank"]
    if machines > 1 and not config.get("main_process_ip"):
        fail(f"num_machines is {machines} but main_process_ip is missing; every machine must know where rank 0 "
             "listens; fix: add `main_process_ip: <address of the machine with machine_rank 0>`")
    if rank >= machines:
        fail(f"machine_rank {rank} must be below num_machines {machines}; fix: use a machine_rank from 0 to "
             f"{machines - 1}")
    processes = config["num_processes"]
    if processes == 0:
        fail("key 'num_processes' has value 0; expected 1 or more (or -1: one per GPU); fix: `num_processes: 1`")
    if processes > 0 and processes % machines:
        fail(f"num_processes {processes} is the total over all machines and must divide evenly by num_machines "
             f"{machines}; fix: use a multiple of {machines}")
    kind = config["distributed_type"]
    if kind == "NO" and processes > 1:
        fail(f"distributed_type NO runs one process but num_processes is {processes}; fix: set "
             "`distributed_type: MULTI_CPU` (or MULTI_GPU), or `num_processes: 1`")
    if config["use_cpu"] and kind not in ("NO", "MULTI_CPU"):
        fail(f"use_cpu is true but distributed_type is {kind}, which needs accelerators; fix: set "
             "`distributed_type: MULTI_CPU` or `use_cpu: false`")
    fsdp = config.get("fsdp_config") or {}
    if fsdp.get("fsdp_cpu_ram_efficient_loading") and fsdp.get("fsdp_sync_module_states") is False:
        fail("fsdp_config.fsdp_cpu_ram_efficient_loading is true but fsdp_sync_module_states is false, so "
             "ranks other than 0 would keep empty weights; fix: set `fsdp_sync_module_states: true`")
    if kind == "FSDP" and fsdp.get("fsdp_version") == 2 and "fsdp_sharding_strategy" in fsdp:
        fail("fsdp_config.fsdp_sharding_strategy is an FSDP1 setting but fsdp_version is 2; fix: replace it with "
             "`fsdp_reshard_after_forward: true` (FULL_SHARD) or `false` (SHARD_GRAD_OP)")


# ----------------------------------------------------------------------------------------------- read / write


def read_raw(path: str) -> Any:
    """The parsed content of a YAML or JSON file, with parse errors as one-line ConfigFileErrors."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError:
        raise ConfigFileError(
            f"config file {path!r} does not exist; create it with `hasten config --config_file {path}`"
        ) from None
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigFileError(f"config file {path!r} cannot be read ({error}); fix its permissions or encoding") from None
    if path.endswith(".json"):
        try:
            return json.loads(text) if text.strip() else {}
        except json.JSONDecodeError as error:
            raise ConfigFileError(
                f"{path}: not valid JSON at line {error.lineno}, column {error.colno}: {error.msg}; fix that line "
                "or regenerate the file with `hasten config`"
            ) from None
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or "syntax error"
        raise ConfigFileError(
            f"{path}: not valid YAML{at}: {problem}; fix that line or regenerate the file with `hasten config`"
        ) from None
    return {} if data is None else data


def load_config_file(path: str, *, fill_defaults: bool = True) -> dict:
    """Read and check one config file; returns the normalised mapping of keys to values."""
    return validate(read_raw(path), source=path, fill_defaults=fill_defaults)


def to_file_dict(config: Mapping[str, Any]) -> dict:
    """What gets written: no None values and no empty blocks (as Accelerate writes), keys in schema order."""
    order = list(TOP_KEYS)
    items = sorted(config.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order))
    return {k: v for k, v in items if v is not None and v != {}}


def write_config_file(config: Mapping[str, Any], path: str, *, overwrite: bool = True) -> str:
    """Check `config` and write it as YAML (JSON if `path` ends with .json), atomically."""
    config = validate(config, source=path, fill_defaults=False)
    if not overwrite and os.path.exists(path):
        raise ConfigFileError(
            f"config file {path!r} already exists and was left unchanged; fix: edit it with `hasten config update` "
            "or `hasten config --config_file <new path>`, or delete it first"
        )
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    data = to_file_dict(config)
    if path.endswith(".json"):
        text = json.dumps(data, indent=2) + "\n"
    else:
        import yaml

        text = yaml.safe_dump(data, default_flow_style=False, sort_keys=False)
    temporary = f"{path}.tmp-{os.getpid()}"
    with open(temporary, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(temporary, path)
    return path


# ----------------------------------------------------------------------------------------------- this machine


def detect_machine() -> dict:
    """Facts about this machine that choose sensible defaults: accelerator kind and count, CPU cores."""
    import psutil
    import torch

    kind, count = "cpu", 0
    if torch.cuda.is_available():
        kind, count = "cuda", torch.cuda.device_count()
    elif hasattr(torch, "xpu") and torch.xpu.is_available():
        kind, count = "xpu", torch.xpu.device_count()
    elif hasattr(torch, "npu") and torch.npu.is_available():
        kind, count = "npu", torch.npu.device_count()
    elif hasattr(torch.backends, "mps") and torch.backends.mps.is_available():
        kind, count = "mps", 1
    return {"device": kind, "device_count": count, "cpu_cores": psutil.cpu_count(logical=False) or 1}


_MULTI = {"cuda": "MULTI_GPU", "xpu": "MULTI_XPU", "npu": "MULTI_NPU"}


def basic_config(mixed_precision: str = "no", machine: Mapping | None = None) -> dict:
    """A config for this machine: every accelerator in one process each, or one CPU process."""
    machine = detect_machine() if machine is None else machine
    count = machine["device_count"]
    config = {"compute_environment": "LOCAL_MACHINE", "mixed_precision": mixed_precision, "debug": False,
              "enable_cpu_affinity": False}
    if machine["device"] == "cpu":
        config.update(distributed_type="NO", num_processes=1, use_cpu=True)
    else:
        distributed = _MULTI.get(machine["device"], "NO") if count > 1 else "NO"
        config.update(distributed_type=distributed, num_processes=max(1, count), use_cpu=False, gpu_ids="all")
    return validate(config, source="<basic config>", fill_defaults=False)


def write_basic_config(mixed_precision: str = "no", save_location: str | None = None) -> str | bool:
    """Write a config for this machine; refuses (returns False) when the file already exists, as Accelerate."""
    path = save_location or default_config_path()
    if os.path.exists(path):
        print(f"Configuration already exists at {path}, will not override. Run `hasten config update` or "
              "`hasten config` to change it, or delete the file first.")
        return False
    if str(mixed_precision).lower() not in PRECISIONS:
        raise ConfigError(f"mixed_precision {mixed_precision!r} is not one of {', '.join(PRECISIONS)}")
    return write_config_file(basic_config(str(mixed_precision).lower()), path, overwrite=False)
