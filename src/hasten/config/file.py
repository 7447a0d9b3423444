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
from typing import Any, Callable, Mapping

from ..core.errors import ConfigError
from . import settings as table

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
# Every key, its type, default, allowed values and meaning come from the settings table (hasten.config.settings).

TOP_KEYS, NESTED_KEYS = table.file_rows()
NESTED_PREFIXES = {row.file_key[0]: row.prefix for row in TOP_KEYS.values() if row.prefix}
PRECISIONS = tuple(table.get("mixed_precision").allowed())
DYNAMO_BACKENDS = table.get("dynamo_backend").choices
DYNAMO_MODES = table.get("dynamo_mode").choices
RDZV_BACKENDS = table.get("rdzv_backend").choices
DISTRIBUTED_TYPES = table.get("distributed_type").choices
# Legacy keys that `validate` rewrites into their current form.
LEGACY_KEYS = {"fp16": table.Setting("fp16", "bool"), "dynamo_backend": table.get("dynamo_backend")}


# ----------------------------------------------------------------------------------------------- checking


def _suggest(name: str, allowed) -> str:
    close = difflib.get_close_matches(name, list(allowed), n=1)
    return f"did you mean {close[0]!r}? " if close else ""


def check_value(name: str, value: Any, key: table.Setting, where: Callable[[str], str]) -> Any:
    """`value` converted to the row's type, or a ConfigFileError built by `where(message)`."""
    try:
        return key.convert(value)
    except ValueError:
        pass
    if key.kind == "dict":
        fix = f"write `{name}:` followed by indented `key: value` lines, or `{name}: {{}}`"
    elif key.choices and isinstance(value, str):
        shown = value.upper() if value.isupper() else value
        close = difflib.get_close_matches(shown, [str(c) for c in key.allowed()], n=1)
        fix = f"write `{name}: {close[0] if close else key.allowed()[0]}`"
    else:
        fix = f"write `{name}: {key.example_text()}`"
    raise ConfigFileError(where(f"key {name!r} has value {value!r}; expected {key.expected_text()}; fix: {fix}"))


def validate(raw: Mapping[str, Any], source: str = "<config>", *, fill_defaults: bool = True,
             refuse_unbuilt: bool = True) -> dict:
    """Check a parsed config mapping; return it normalised (types fixed, legacy keys rewritten, and with
    `fill_defaults` the missing keys filled in; without it only the keys the file really sets).

    A key that asks for something hasten has not built (a DeepSpeed block, `mixed_precision: fp8`, ...) is a
    one-line NotBuiltError; `hasten launch` passes `refuse_unbuilt=False` and refuses after its flags are known
    (a typed --cpu replaces the file's distributed_type and its blocks)."""
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
    if refuse_unbuilt:
        table.refuse_unbuilt_file(present, source)
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
            row = known.get(name) if known else None
            if row is None and TOP_KEYS[block].built and known:
                raise ConfigFileError(where(
                    f"unknown key {full!r}; {_suggest(str(name), known)}allowed: {', '.join(known)}; fix: remove or "
                    "rename it"
                ))
            result[name] = value if row is None else check_value(full, value, row, where)
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

    if config["compute_environment"] != "LOCAL_MACHINE":
        table.get("compute_environment").refuse(f"{where('compute_environment')}", config["compute_environment"])
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
    if config["use_cpu"] and kind not in ("NO", "MULTI_CPU", "DEEPSPEED", "MEGATRON_LM"):  # hasten runs these on CPUs too
        fail(f"use_cpu is true but distributed_type is {kind}, which needs accelerators; fix: set "
             "`distributed_type: MULTI_CPU` or `use_cpu: false`")
    # Two FSDP combinations Accelerate reads without complaint, and settles where the plugin is built (a warning
    # that turns sync_module_states on; FSDP2 not reading the FSDP1 strategy): refused here under `strict` only.
    fsdp = config.get("fsdp_config") or {}
    if not (config.get("strict") or _strict_from_environment()):
        return
    if fsdp.get("fsdp_cpu_ram_efficient_loading") and fsdp.get("fsdp_sync_module_states") is False:
        fail("fsdp_config.fsdp_cpu_ram_efficient_loading is true but fsdp_sync_module_states is false, so "
             "ranks other than 0 would keep empty weights; fix: set `fsdp_sync_module_states: true` (an error under "
             "hasten's strict setting)")
    if kind == "FSDP" and fsdp.get("fsdp_version") == 2 and "fsdp_sharding_strategy" in fsdp:
        fail("fsdp_config.fsdp_sharding_strategy is an FSDP1 setting but fsdp_version is 2; fix: replace it with "
             "`fsdp_reshard_after_forward: true` (FULL_SHARD) or `false` (SHARD_GRAD_OP) (an error under hasten's "
             "strict setting)")


def _strict_from_environment() -> bool:
    from ..core.env import parse_bool

    try:
        return parse_bool(os.environ.get("HASTEN_STRICT") or "false")
    except ValueError:
        return False


def refuse_one_process_with_many(values: Mapping, source: str) -> None:
    """A file with `distributed_type: NO` and `num_processes` above 1: Accelerate reads it and then runs one
    process, dropping num_processes; `hasten launch` refuses it in one line instead. (Reading the file, or building
    a `ClusterConfig` from such values, works as in Accelerate: only launching it is refused.)"""
    processes = values.get("num_processes")
    if values.get("distributed_type", "NO") == "NO" and isinstance(processes, int) and processes > 1:
        raise ConfigFileError(
            f"{source}: distributed_type NO runs one process but num_processes is {processes}; fix: set "
            "`distributed_type: MULTI_CPU` (or MULTI_GPU), or `num_processes: 1`"
        )


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
    """Write a config for this machine; refuses (returns False) when the file already exists, as Accelerate.

    As Accelerate, the text is JSON whatever the file's name (JSON is YAML too, so a `.yaml` name reads back the
    same); `hasten config` and `write_config_file` write YAML."""
    path = os.fspath(save_location) if save_location else default_config_path()  # Accelerate's tests pass a Path
    if os.path.exists(path):
        print(f"Configuration already exists at {path}, will not override. Run `hasten config update` or "
              "`hasten config` to change it, or delete the file first.")
        return False
    if str(mixed_precision).lower() not in PRECISIONS:
        raise ConfigError(f"mixed_precision {mixed_precision!r} is not one of {', '.join(PRECISIONS)}")
    table.get("mixed_precision").refuse(f"write_basic_config(mixed_precision={mixed_precision!r})",
                                        str(mixed_precision).lower())
    config = to_file_dict(basic_config(str(mixed_precision).lower()))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    temporary = f"{path}.tmp-{os.getpid()}"
    with open(temporary, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(config, indent=2, sort_keys=True) + "\n")
    os.replace(temporary, path)
    return path
