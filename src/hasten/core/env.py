"""Reading the environment: the one boolean parser, the one integer parser, and the variables they read.

Pure helpers over text and an environment mapping (default `os.environ`); every floor above reads variables
through them, so "yes"/"1"/"on" mean the same in flags, config files, plugins and environment variables.
hasten reads its own `HASTEN_*` variables and Accelerate's `ACCELERATE_*` ones; when both are set, hasten's win.
"""

from __future__ import annotations

import os
import re
from typing import Mapping

from .errors import ConfigError

_TRUE = {"y", "yes", "t", "true", "on", "1"}
_FALSE = {"n", "no", "f", "false", "off", "0"}


# The one boolean parser and the one integer parser of hasten: flags, config files, environment variables,
# plugins and the questionnaire all read text through these two, so "yes"/"1"/"on" mean the same everywhere.


def parse_bool(value) -> bool:
    """True/False from a bool or from y/yes/t/true/on/1 and n/no/f/false/off/0 (any case); else ValueError."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"invalid truth value {value!r}: use one of {sorted(_TRUE)} or {sorted(_FALSE)}")


def parse_int(value, minimum: int | None = None, maximum: int | None = None) -> int:
    """A whole number from an int, a whole float or its text, within [minimum, maximum]; else ValueError."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not an integer")
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError(f"{value!r} is not an integer")
        value = int(value)
    if not isinstance(value, int):
        try:
            value = int(str(value).strip())
        except ValueError:
            raise ValueError(f"{value!r} is not an integer") from None
    if minimum is not None and value < minimum:
        if value < 0 <= minimum:
            raise ValueError(f"{value} is negative; give {minimum} or more")
        raise ValueError(f"{value} is not allowed; give {minimum} or more")
    if maximum is not None and value > maximum:
        raise ValueError(f"{value} is too large; give {maximum} or less")
    return value


def str_to_bool(value, to_bool: bool = False):
    """Parse a truthy/falsy string the way Accelerate does (1/0, or True/False with `to_bool`)."""
    result = parse_bool(str(value))
    return result if to_bool else int(result)


def env_name_used(name: str, env: Mapping[str, str] | None = None) -> str | None:
    """The variable that supplies setting `name` (`HASTEN_<name>` first, then `ACCELERATE_<name>`)."""
    env = os.environ if env is None else env
    for prefix in ("HASTEN_", "ACCELERATE_"):
        if prefix + name in env:
            return prefix + name
    return None


def env_value(name: str, default=None, env: Mapping[str, str] | None = None):
    """The value of setting `name` from `HASTEN_<name>` or `ACCELERATE_<name>`, else `default`."""
    env = os.environ if env is None else env
    key = env_name_used(name, env)
    return default if key is None else env[key]


def env_flag(name: str, default: bool = False, env: Mapping[str, str] | None = None) -> bool:
    """A boolean setting; a value that is neither truthy nor falsy is a ConfigError naming the variable."""
    env = os.environ if env is None else env
    key = env_name_used(name, env)
    if key is None:
        return default
    try:
        return parse_bool(env[key])
    except ValueError:
        raise ConfigError(
            f"environment variable {key}={env[key]!r} is not a boolean; set it to 1/0, true/false or yes/no"
        ) from None


def parse_flag_from_env(key: str, default: bool = False) -> bool:
    """Accelerate's helper: read one exact variable as a boolean."""
    value = os.environ.get(key)
    return default if value is None else parse_bool(value)


def parse_choice_from_env(key: str, default: str = "no") -> str:
    return os.environ.get(key, str(default))


def get_int_from_env(env_keys, default: int) -> int:
    """The first non-negative integer among `env_keys`, else `default`."""
    for key in env_keys:
        text = os.environ.get(key, "-1")
        try:
            value = parse_int(text)
        except ValueError:
            raise ConfigError(f"environment variable {key}={text!r} must be an integer") from None
        if value >= 0:
            return value
    return default


# SLURM writes host and task lists in its own compressed text; cluster detection and `hasten launch` both read it.


def first_slurm_host(nodelist: str) -> str:
    """First host of a SLURM node list such as `gpu[03-05,09],cpu1` -> `gpu03`."""
    match = re.match(r"([^,\[]+)(\[([^\]]+)\])?", nodelist.strip())
    if not match:
        return nodelist
    prefix, _, ranges = match.groups()
    if not ranges:
        return prefix
    return prefix + ranges.split(",")[0].split("-")[0]


def slurm_tasks_on_first_node(spec: str) -> int:
    """`SLURM_STEP_TASKS_PER_NODE` looks like `4(x2),3`; the count on this job's nodes is the first number."""
    match = re.match(r"(\d+)", spec or "")
    return int(match.group(1)) if match else 1


def gloo_interface_words(env=None) -> str:
    """Which network interface gloo uses, in words, for a start-up failure or a hang report."""
    env = os.environ if env is None else env
    chosen = env.get("GLOO_SOCKET_IFNAME")
    if chosen:
        source = " (from NCCL_SOCKET_IFNAME)" if env.get("NCCL_SOCKET_IFNAME") else ""
        return f"gloo uses network interface {chosen} (GLOO_SOCKET_IFNAME={chosen}{source})"
    return ("gloo picks its network interface from this machine's hostname (GLOO_SOCKET_IFNAME and "
            "NCCL_SOCKET_IFNAME are unset)")
