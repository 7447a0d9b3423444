"""One precedence for every setting, and a record of where each value came from.

    code  >  launch flag  >  environment variable  >  config file  >  built-in default

Two exceptions inside the script, as in Accelerate: a launcher's gradient_accumulation_steps replaces the
Accelerator argument, and a true HASTEN_/ACCELERATE_USE_CPU forces CPU even when the code says cpu=False.

`hasten launch` resolves flags, the user's environment and the config file, then exports the winners as
`HASTEN_*` / `FSDP_*` variables. As Accelerate's launcher, it writes the file's values and its own defaults
over the `ACCELERATE_*` / `FSDP_*` variables the user exported (`launch_settings._file_over_environment`);
with `environment_over_file` it keeps this order and never writes over a user's variable. It also exports `HASTEN_CONFIG_SOURCES` (JSON: setting -> [source, origin]) so that
code inside the training processes can still tell a value from a flag apart from one from the file:

    from hasten.config.resolve import explain
    print(explain(code={"mixed_precision": "bf16"}))   # what the script passes to Accelerator(...)
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
from dataclasses import dataclass
from typing import Any, Mapping

from ..core.enums import PrecisionType
from ..core.errors import ConfigError
from . import settings as table
from .settings import Setting

SOURCES = ("code", "flag", "environment", "file", "default")

# Set (in one thread or task only) by `environment_hidden`: resolving then sees no environment variables.
_ENVIRONMENT_HIDDEN = contextvars.ContextVar("hasten_environment_hidden", default=False)


@contextlib.contextmanager
def environment_hidden():
    """Resolve settings as if no variable were set, in this thread only (os.environ itself is not touched):
    `KwargsHandler.to_kwargs` builds its default instance this way."""
    token = _ENVIRONMENT_HIDDEN.set(True)
    try:
        yield
    finally:
        _ENVIRONMENT_HIDDEN.reset(token)
SOURCES_VARIABLE = "HASTEN_CONFIG_SOURCES"


@dataclass(frozen=True)
class Resolved:
    """The value of one setting and where it came from."""

    name: str
    value: Any
    source: str  # one of SOURCES
    origin: str  # "--mixed_precision", "HASTEN_MIXED_PRECISION", "<file>: mixed_precision", "built-in default"


def _text(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


# The settings this module resolves: the table's built rows (hasten.config.settings).
SETTINGS = table.resolvable()
BY_NAME = {setting.name: setting for setting in SETTINGS}
PARADIGM_FLAGS = table.PARADIGM_FLAGS
# FSDP settings: exported as Accelerate's FSDP_* names for the FSDP backend (only when set: its own defaults apply
# otherwise).
FSDP_ENV = {s.name: s.export for s in SETTINGS if s.owner == "FullyShardedDataParallelPlugin"}


# ----------------------------------------------------------------------------------------------- sources


def _from_file(setting: Setting, values: Mapping | None, path: str | None):
    """(value, origin) when the file sets this setting, else None."""
    if not values:
        return None
    if setting.distributed_type:  # a paradigm switch: the file spells it `distributed_type: FSDP`
        kind = values.get("distributed_type")
        if kind is None:
            return None
        return (kind == setting.distributed_type), f"{path}: distributed_type"
    if setting.file_key is None:
        return None
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
                return setting.convert(text), variable
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
    from ..core.env import first_slurm_host, parse_int, slurm_tasks_on_first_node

    def number(name, default):
        try:
            return parse_int(env.get(name, default))
        except ValueError:
            raise ConfigError(f"environment variable {name}={env.get(name)!r} must be an integer (set by SLURM)") from None

    nodes = number("SLURM_STEP_NUM_NODES", number("SLURM_NNODES", 1))
    tasks = number("SLURM_STEP_NUM_TASKS", number("SLURM_NTASKS", 1))
    per_node = slurm_tasks_on_first_node(env.get("SLURM_STEP_TASKS_PER_NODE", env.get("SLURM_TASKS_PER_NODE", "")))
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or "127.0.0.1"
    if tasks > nodes or per_node > 1:
        return {"slurm_per_task": (True, f"SLURM_NTASKS={tasks} over SLURM_NNODES={nodes}")}
    result = {
        "num_machines": (nodes, "SLURM_NNODES"),
        "machine_rank": (number("SLURM_NODEID", 0), "SLURM_NODEID"),
        "main_process_ip": (env.get("MASTER_ADDR") or first_slurm_host(nodelist), "SLURM_STEP_NODELIST"),
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
    env = (({} if _ENVIRONMENT_HIDDEN.get() else os.environ) if env is None else env)
    recorded = recorded_sources(env)
    settings = SETTINGS if settings is None else settings
    # SLURM only supplies the launch structure (machines, ranks): read it only when such a setting is asked for.
    slurm = slurm_values(env) if any(s.owner == "launcher" for s in settings) else {}
    result = {}
    for setting in settings:
        name = setting.name
        if name in code and code[name] is not None and not _env_overrides_code(setting, code[name], env):
            result[name] = Resolved(name, code[name], "code", f"in the script ({name}=...)")
            continue
        # a switch (store_true) that was not typed reads False, as in Accelerate's parser: not a flag value
        typed = (flags.get(setting.flag) is not None and not (setting.switch and flags[setting.flag] is False)
                 and not isinstance(flags[setting.flag], table.ParserDefault))
        if setting.flag and typed:
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


def runtime_value(name: str, code=None, env: Mapping[str, str] | None = None):
    """The value a training process uses for setting `name`: `code` (the argument passed in the script, None if
    not passed) > environment variable > default, by the same `resolve` that `hasten config explain` calls.

    A value hasten has not built (mixed_precision fp8, ...) is refused with the table's one-line NotBuiltError.
    """
    setting = BY_NAME.get(name) or table.BY_NAME[name]  # a variable-only row (role "environment") resolves alike
    resolved = resolve(code={name: code} if code is not None else None, env=env, settings=[setting])[name]
    if setting.refusal(resolved.value) is not None:
        where = {"code": f"{setting.owner}({setting.code}={resolved.value!r})", "default": "the default"}
        setting.refuse(where.get(resolved.source, f"environment variable {resolved.origin}"), resolved.value)
    return resolved


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


def strict() -> bool:
    """Whether hasten's stricter checks are on (`--strict`, `HASTEN_STRICT=1`, `strict: true` in the config file).

    Off by default: an unchanged Accelerate script then sees Accelerate's behaviour (a warning, or silent
    acceptance); on, each of those cases is a one-line error naming the fix.
    """
    return bool(runtime_value("strict").value)


def data_own_rng() -> bool:
    """Whether prepared data loaders keep generators of their own (`--data_own_rng`, `HASTEN_DATA_OWN_RNG=1`,
    `data_own_rng: true` in the config file). Off by default: shuffles and worker seeds draw from torch's global
    RNG as in Accelerate; on, iterating a prepared loader never touches it."""
    return bool(runtime_value("data_own_rng").value)


def resolve_mixed_precision(value) -> str:
    """Explicit value, else `HASTEN_/ACCELERATE_MIXED_PRECISION`, else "no"; anything unknown is an error."""
    if value is not None:
        text = str(value).lower()
        if text not in PrecisionType:
            raise ConfigError(
                f"Unknown mixed precision {value!r} (from the mixed_precision argument); choose one of "
                f"{PrecisionType.list()}"
            )
        value = text
    return runtime_value("mixed_precision", value).value
