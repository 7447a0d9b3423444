"""One row of the settings table (`hasten.config.settings`): a setting and every name it goes by, how a raw value
from a flag, a variable or the config file becomes a typed one, and whether hasten has built it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from ..core.errors import NotBuiltError
from ..core.env import parse_bool, parse_int


class ParserDefault(str):
    """The value an untyped launch flag reads where Accelerate's parser gives it a default (`"true"` for
    `--fsdp_sync_module_states`): code that reads the parsed command line sees Accelerate's value, while the
    precedence still knows the flag was not typed, so the environment and the config file apply."""


@dataclass(frozen=True)
class Setting:
    """One setting and every name it goes by."""

    name: str
    kind: str = "str"  # bool, int, float, str, gpu_ids, bool_or_str, str_or_list, list, dict, bools3, any
    default: Any = None
    flags: tuple = ()  # launch options; the first is the main spelling. `--a_b` also answers to `--a-b`.
    env: tuple = ()  # variables read inside the training processes; the first one set wins
    export: str | None = None  # the variable `hasten launch` writes (None: not exported)
    file_key: tuple | None = None  # path in the config file: ("mixed_precision",) or ("fsdp_config", "fsdp_version")
    help: str = ""
    owner: str = "launcher"  # who uses the value: launcher, Accelerator, TorchDynamoPlugin, ...
    code: str | None = None  # the owner's argument that sets it in code (Accelerator(mixed_precision=...))
    choices: tuple | None = None  # allowed values, always taken from hasten.core.enums
    minimum: float | None = None
    maximum: float | None = None
    range_text: str = ""  # how an out-of-range number is described ("a TCP port (0-65535)")
    built: bool = True
    feature: str = ""  # for a row not built: what it belongs to ("DeepSpeed"), named in the refusal
    fix: str = ""  # for a row not built: what to do instead
    unbuilt_values: Mapping = field(default_factory=dict)  # value -> (feature, fix), for a built row
    role: str = "setting"  # setting: resolved and explained; option: how the launcher runs; file: file structure
    dest: str | None = None  # argparse destination when it differs from `name` (--cpu -> use_cpu)
    switch: bool = False  # the flag takes no value (store_true)
    append: bool = False  # the flag may repeat (each value appended)
    requires: str | None = None  # the dest of another flag this flag means nothing without
    group: str = "Other"
    hidden: bool = False  # left out of --help (still accepted)
    question: str = ""  # what `hasten config` asks
    example: str = ""
    case: str | None = None  # "lower" / "upper": how typed text is normalised before matching choices
    file_aliases: tuple = ()  # other spellings Accelerate writes for the same file key
    prefix: str | None = None  # for a block: every key in it must start with this (any such key is accepted)
    distributed_type: str | None = None  # a switch that the file spells as `distributed_type: <this>`
    file_override: Mapping = field(default_factory=dict)  # fields that differ in the config file (num_processes: -1)

    # -- names ----------------------------------------------------------------------------------------------
    @property
    def flag_dest(self) -> str:
        return self.dest or self.name

    @property
    def flag(self) -> str | None:
        """The argparse destination of the launch flag (None: no flag)."""
        return self.flag_dest if self.flags else None

    @property
    def flag_text(self) -> str:
        return self.flags[0] if self.flags else self.name

    @property
    def file_text(self) -> str:
        return ".".join(self.file_key) if self.file_key else ""

    # -- values ---------------------------------------------------------------------------------------------
    def allowed(self) -> list:
        """The allowed values, built ones first (the order error messages list them in)."""
        if not self.choices:
            return []
        return [c for c in self.choices if c not in self.unbuilt_values] + [
            c for c in self.choices if c in self.unbuilt_values
        ]

    def expected_text(self) -> str:
        if self.kind == "bool_or_str":
            return "true or false (or an FSDP1 strategy: " + ", ".join(self.choices or ()) + ")"
        if self.choices:
            return "one of " + ", ".join(str(c) for c in self.allowed())
        text = {
            "int": "a whole number", "float": "a number", "bool": "true or false", "str": "a string",
            "dict": "a mapping of keys to values", "gpu_ids": "'all' or comma-separated GPU ids such as '0,1'",
            "str_or_list": "a string or a list of strings", "list": "a list",
            "bools3": "three comma-separated booleans such as false,false,true",
        }.get(self.kind, "a value")
        if self.minimum is not None and self.maximum is not None:
            text += f" from {self.minimum:g} to {self.maximum:g}"
        elif self.minimum is not None:
            text += f" of {self.minimum:g} or more"
        return text

    def example_text(self) -> str:
        if self.example:
            return self.example
        if self.choices:
            return str(self.allowed()[0])
        return {"int": "1" if self.minimum in (None, 0, 1) else str(int(self.minimum)), "float": "0.1",
                "bool": "true", "str": "<text>", "gpu_ids": "all", "bool_or_str": "true",
                "str_or_list": "<text>", "bools3": "false,false,true"}.get(self.kind, "...")

    def convert(self, value):
        """`value` (text from a flag or variable, or a YAML value) in this setting's type; ValueError if it fits not.

        The one conversion used by the config file, the environment and the runtime.
        """
        if value is None:
            return None
        kind = self.kind
        try:
            if kind in ("any", "list"):
                return value
            if kind == "bool_or_str":
                if isinstance(value, str) and value.strip().upper() in (self.choices or ()):
                    return value.strip().upper()
                return parse_bool(value)
            if kind == "bool":
                return parse_bool(value)
            if kind == "bools3":  # fp8's override_linear_precision: kept as text "a,b,c" (one variable carries it)
                parts = value.split(",") if isinstance(value, str) else value
                if value is False:
                    parts = [False] * 3
                if not isinstance(parts, (list, tuple)) or len(parts) != 3:
                    raise ValueError
                return ",".join(str(parse_bool(p) if isinstance(p, str) else _strict_bool(p)).lower() for p in parts)
            if kind == "int":
                number = parse_int(value, self.minimum, self.maximum)
                if self.choices and number not in self.choices:
                    raise ValueError
                return number
            if kind == "float":
                if isinstance(value, bool):
                    raise ValueError
                number = float(value)
                if (self.minimum is not None and not number >= self.minimum) or (
                    self.maximum is not None and number > self.maximum
                ):
                    raise ValueError
                return number
            if kind == "gpu_ids":
                text = ",".join(str(v) for v in value) if isinstance(value, list) else str(value)
                text = text.replace(" ", "")
                if text.lower() == "all":
                    return "all"
                if not text or not all(part.isdigit() for part in text.split(",")):
                    raise ValueError
                return text
            if kind == "dict":
                if value == "" or value == []:
                    return {}
                if not isinstance(value, dict):
                    raise ValueError
                return value
            if kind == "str_or_list":
                if isinstance(value, str) or isinstance(value, list) and all(isinstance(v, str) for v in value):
                    return value
                raise ValueError
            # kind == "str"
            if value is False and self.choices and any(str(c).lower() == "no" for c in self.choices):
                value = "no"  # YAML 1.1 reads an unquoted NO as false (`distributed_type: NO`, `mixed_precision: no`)
            if not isinstance(value, (str, int, float)) or isinstance(value, bool):
                raise ValueError
            value = str(value)
            if self.choices:
                for choice in self.choices:
                    if value.strip().lower() == str(choice).lower():
                        return choice
                raise ValueError
            return value
        except (ValueError, TypeError):
            raise ValueError(f"expected {self.expected_text()}") from None

    def is_set(self, value) -> bool:
        """Whether a (converted) value asks for something: for a row not built, whether it must be refused."""
        if value is None or value is False or value in ("", [], {}, ()):
            return False
        return value != self.default

    # -- refusing what is not built ---------------------------------------------------------------------------
    def refusal(self, value=None) -> str | None:
        """The reason `value` cannot be used (None: it can)."""
        if not self.built:
            return f"{self.feature} is not built in hasten yet; fix: {self.fix}"
        if value is not None and self.unbuilt_values and _hashable(value) and value in self.unbuilt_values:
            feature, fix = self.unbuilt_values[value]
            return f"{feature} is not built in hasten yet; fix: {fix}"
        return None

    def refuse(self, origin: str, value=None) -> None:
        """Raise the one-line NotBuiltError when `value` (or the row itself) is not built; otherwise return."""
        reason = self.refusal(value)
        if reason is not None:
            raise NotBuiltError(f"{origin}: {reason}")


def _strict_bool(value) -> bool:
    if not isinstance(value, bool):
        raise ValueError
    return value


def _hashable(value) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True
