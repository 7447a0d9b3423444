"""`FullyShardedDataParallelPlugin`: the settings of a sharded (FSDP) run, with Accelerate's field names.

One precedence rule for every field: a value passed to the constructor wins, else the `FSDP_*` environment
variable (written by `hasten launch --use_fsdp --fsdp_*` or a config file), else the default. Every value is
checked once, here, and a bad one is a `ConfigError` naming the field, the value, where it came from and the
allowed values. The backend (`hasten.backends.fsdp.backend`) only reads the resolved fields.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional, Union

import torch
from torch.distributed.fsdp import BackwardPrefetch, ShardingStrategy, StateDictType

from ..core.enums import FSDP_AUTO_WRAP_POLICY
from ..core.errors import ConfigError
from ..core.env import parse_bool, parse_int
from ..core.dtypes import PRECISION_DTYPES
from .settings import SETTINGS

_AUTO_WRAP_NAMES = tuple(name.lower() for name in FSDP_AUTO_WRAP_POLICY)


# Accelerate logs what FSDP2 drops on its `utils.dataclasses` logger, in these words (scripts and tests match
# them); `logging.getLogger("accelerate.utils.dataclasses")` is this logger under the accelerate alias.
_ACCELERATE_LOGGER = logging.getLogger("hasten.utils.dataclasses")
_FSDP2_DROPPED = {
    "backward_prefetch": "backward_prefetch is not supported in FSDP2. Setting backward prefetch to None.",
    "use_orig_params": "use_orig_params is obsolete in FSDP2, as FSDP2 always uses the original parameters.",
    "sync_module_states": "sync_module_states is obsolete in FSDP2, as it is not needed anymore."
                          "Setting sync_module_states to None.",
    "sharding_strategy": "sharding_strategy is an FSDP1 setting; FSDP2 reads reshard_after_forward.",  # (hasten's)
}

_ROWS = {row.env[0][len("FSDP_"):].lower(): row for row in SETTINGS if row.owner == "FullyShardedDataParallelPlugin"}


def _env(field_name: str) -> tuple[Optional[str], Optional[str]]:
    """(text, variable) of the variable the settings table names for `field_name`, or (None, None).

    The text is checked by the table's row (one message for a bad value, as `hasten launch` gives) and then
    turned into the field's object below.
    """
    row = _ROWS[field_name]
    from .resolve import resolve

    given = [(name, os.environ[name]) for name in row.env if os.environ.get(name, "") != ""]
    try:  # the table's one precedence decides the value, as for every other setting
        found = resolve(settings=[row])[row.name]
    except ConfigError:  # a bad value is given: the field's own check below names it with the plugin's words
        return given[0][1], given[0][0]
    # a variable the launcher wrote from its own defaults is recorded with source "default": still given
    if found.value is None or (found.source == "default" and found.origin == "built-in default") or not given:
        return None, None
    value = found.value  # the table's value, as text (the field's converters below read text)
    return (str(value).lower() if isinstance(value, bool) else str(value)), given[0][0]


def _source(variable: Optional[str]) -> str:
    return f"environment variable {variable}" if variable else "FullyShardedDataParallelPlugin(...)"


def _bool(value, field_name: str, variable: Optional[str]) -> bool:
    if isinstance(value, bool):
        return value
    try:
        return parse_bool(value)
    except ValueError:
        raise ConfigError(
            f"fsdp {field_name}={value!r} (from {_source(variable)}) is not a boolean; use true or false"
        ) from None


def _is_bool_text(text: str) -> bool:
    """true/false (or yes/no...): FSDP2's spelling of reshard_after_forward; a number names an FSDP1 strategy."""
    if text.strip().isdigit():
        return False
    try:
        parse_bool(text)
    except ValueError:
        return False
    return True


def _enum(enum_cls, value, field_name: str, variable: Optional[str]):
    """An enum member from itself, its name (any case) or its 1-based position, as Accelerate accepts."""
    if isinstance(value, enum_cls):
        return value
    text = str(value).strip().upper()
    members = list(enum_cls)
    if text.isdigit() and 1 <= int(text) <= len(members):
        return members[int(text) - 1]
    if text in enum_cls.__members__:
        return enum_cls[text]
    if "_" + text in enum_cls.__members__:  # torch spells HYBRID_SHARD_ZERO2 `_HYBRID_SHARD_ZERO2`
        return enum_cls["_" + text]
    raise ConfigError(
        f"fsdp {field_name}={value!r} (from {_source(variable)}) is not valid; choose one of "
        f"{', '.join(enum_cls.__members__)}"
    )


@dataclass
class FullyShardedDataParallelPlugin:
    """How to shard models with PyTorch FSDP (`fully_shard` for version 2, `FullyShardedDataParallel` for 1).

    On hasten, FSDP also runs on CPU processes (gloo), which Accelerate never selects; options the device cannot
    honour there (parameter offload to CPU when the parameters already live on CPU) fail at `prepare` with
    a message saying which setting to change.
    """

    fsdp_version: Optional[int] = None
    sharding_strategy: Union[str, ShardingStrategy, None] = None
    reshard_after_forward: Union[bool, str, ShardingStrategy, None] = None
    backward_prefetch: Union[str, BackwardPrefetch, None] = None
    mixed_precision_policy: Any = None
    auto_wrap_policy: Union[str, Callable, None] = None
    cpu_offload: Any = None
    ignored_modules: Union[Iterable[torch.nn.Module], str, None] = None
    state_dict_type: Union[str, StateDictType, None] = None
    state_dict_config: Any = None
    optim_state_dict_config: Any = None
    limit_all_gathers: bool = True
    use_orig_params: Optional[bool] = None
    param_init_fn: Optional[Callable[[torch.nn.Module], None]] = None
    sync_module_states: Optional[bool] = None
    forward_prefetch: Optional[bool] = None
    activation_checkpointing: Optional[bool] = None
    activation_checkpointing_offload: Optional[bool] = None
    cpu_ram_efficient_loading: Optional[bool] = None
    transformer_cls_names_to_wrap: Optional[list] = None
    min_num_params: Optional[int] = None
    #: Where each field's value came from ("argument", "environment variable FSDP_X" or "default").
    sources: dict = field(default_factory=dict, init=False, repr=False, compare=False)  # a record, not a setting

    def __post_init__(self):
        self._resolve_version()
        self._resolve_sharding()
        self._resolve_simple_flags()
        self._resolve_auto_wrap()
        self._resolve_state_dict_type()
        self._resolve_prefetch()
        self._resolve_ignored_modules()
        self._refuse_v1_only_arguments()
        self.cpu_offload = self._offload_policy(self.cpu_offload)
        if self.mixed_precision_policy is not None:
            self.mixed_precision_policy = self._mixed_precision(self.mixed_precision_policy)

    def _refuse_v1_only_arguments(self) -> None:
        # FSDP2 (fully_shard) has neither knob: it always bounds in-flight all-gathers, and it never calls an init
        # function on meta modules (cpu_ram_efficient_loading materialises them). Accelerate accepts and drops them;
        # hasten says so in a warning, and refuses them under its strict setting.
        if self.fsdp_version != 2:
            return
        from .resolve import strict

        dropped = []
        if self.param_init_fn is not None:
            dropped.append("fsdp param_init_fn is an FSDP1 setting that FSDP2 never calls; fix: use "
                           "cpu_ram_efficient_loading=True to materialise a meta model, or fsdp_version=1")
        if self.limit_all_gathers is False:
            dropped.append("fsdp limit_all_gathers=False is an FSDP1 setting; FSDP2 always limits all-gathers, "
                           "fix: leave it at True, or use fsdp_version=1")
        for message in dropped:
            if strict():
                raise ConfigError(f"{message} (an error under hasten's strict setting)")
            warnings.warn(f"{message} (ignored, as Accelerate ignores it)", stacklevel=4)

    # -- resolution: argument > FSDP_* variable > default -------------------------------------------------
    def _pick(self, field_name: str, default, env_name: Optional[str] = None):
        """(value, variable) for a field: the argument if given, else the variable, else the default."""
        value = getattr(self, field_name)
        if value is not None:
            self.sources[field_name] = "argument"
            return value, None
        text, variable = _env(env_name or field_name)
        if text is not None:
            self.sources[field_name] = f"environment variable {variable}"
            return text, variable
        self.sources[field_name] = "default"
        return default, None

    def _warn_v1_only(self, name: str, variable: Optional[str]) -> None:
        """An FSDP1-only value is dropped under FSDP2: say so as Accelerate does (its words, on its logger
        `accelerate.utils.dataclasses`), then where the value came from. Not for the values `hasten launch`
        exports by default (Accelerate's launcher exports them too, and FSDP2 never reads them there)."""
        from .resolve import recorded_sources

        if variable is None:
            where = "FullyShardedDataParallelPlugin(...)"
        else:
            source, origin = recorded_sources(os.environ).get(_ROWS[name].name, ("environment", variable))
            if source == "default":
                return
            where = f"environment variable {variable}" if source == "environment" else f"{source} {origin}"
        from .resolve import strict

        if strict():
            raise ConfigError(f"fsdp {name} (from {where}) is an FSDP1 setting that FSDP2 ignores; fix: remove it, or "
                              "use fsdp_version=1 (an error under hasten's strict setting)")
        _ACCELERATE_LOGGER.warning("%s (fsdp %s from %s; FSDP1 only: remove it, or use fsdp_version=1)",
                                   _FSDP2_DROPPED[name], name, where)

    def _resolve_version(self):
        value, variable = self._pick("fsdp_version", 1, "version")
        try:
            version = parse_int(value)
        except (TypeError, ValueError):
            version = None
        if version not in (1, 2):
            raise ConfigError(f"fsdp_version={value!r} (from {_source(variable)}) must be 1 or 2")
        self.fsdp_version = version

    def _resolve_sharding(self):
        explicit_strategy = self.sharding_strategy is not None
        if explicit_strategy:
            warnings.warn(
                "FullyShardedDataParallelPlugin(sharding_strategy=...) is deprecated (as in Accelerate); use "
                "reshard_after_forward=True/False for FSDP2 or a ShardingStrategy there for FSDP1",
                FutureWarning, stacklevel=4,
            )
            if self.fsdp_version == 2:
                raise ConfigError(
                    "fsdp sharding_strategy is an FSDP1 setting but fsdp_version is 2; pass "
                    "reshard_after_forward=True (FULL_SHARD) or False (SHARD_GRAD_OP) instead"
                )
            self.sharding_strategy = _enum(ShardingStrategy, self.sharding_strategy, "sharding_strategy", None)
            self.sources["sharding_strategy"] = "argument"
        if self.reshard_after_forward is None and not explicit_strategy:
            text, variable = _env("reshard_after_forward")
            if self.fsdp_version == 1 and (text is None or _is_bool_text(text)):
                # FSDP2's true/false means nothing to FSDP1, whose strategy comes first from FSDP_SHARDING_STRATEGY
                # (`hasten launch --use_fsdp` writes both, as Accelerate's launcher does)
                strategy, strategy_variable = _env("sharding_strategy")
                if strategy is not None:
                    text, variable = strategy, strategy_variable
            source = f"environment variable {variable}" if variable else "default"
            default = True if self.fsdp_version == 2 else "FULL_SHARD"
            if self.fsdp_version == 1:
                # As in Accelerate: FSDP1's strategy lives in sharding_strategy; reshard_after_forward stays None
                # (scripts compare it), unless the script gave it.
                self.sharding_strategy = _enum(ShardingStrategy, default if text is None else text,
                                               "sharding_strategy", variable)
                self.sources["sharding_strategy"] = source
                return
            self.reshard_after_forward = default if text is None else text
            self.sources["reshard_after_forward"] = source
        else:
            variable = None
            self.sources.setdefault("reshard_after_forward", "argument")
        value = self.reshard_after_forward
        if self.fsdp_version == 2:
            strategy, strategy_variable = _env("sharding_strategy")
            if strategy is not None:  # e.g. an FSDP1 config file's fsdp_sharding_strategy beside fsdp_version: 2
                self._warn_v1_only("sharding_strategy", strategy_variable)
            if isinstance(value, ShardingStrategy) or (
                isinstance(value, str) and value.strip().upper() in ShardingStrategy.__members__
            ):
                raise ConfigError(
                    f"fsdp reshard_after_forward={value!r} (from {_source(variable)}) is an FSDP1 sharding "
                    "strategy; with fsdp_version=2 use true (like FULL_SHARD) or false (like SHARD_GRAD_OP)"
                )
            self.reshard_after_forward = _bool(value, "reshard_after_forward", variable)
        elif value is not None:
            if isinstance(value, bool):
                raise ConfigError(
                    f"fsdp reshard_after_forward={value!r} is an FSDP2 setting; with fsdp_version=1 give a "
                    f"sharding strategy ({', '.join(ShardingStrategy.__members__)})"
                )
            self.reshard_after_forward = _enum(ShardingStrategy, value, "reshard_after_forward", variable)
            if self.sharding_strategy is None:
                self.sharding_strategy = self.reshard_after_forward

    def _resolve_simple_flags(self):
        v1_only = {"use_orig_params": False, "sync_module_states": False, "forward_prefetch": False}
        for name, default in v1_only.items():
            value, variable = self._pick(name, default)
            value = _bool(value, name, variable)
            if self.fsdp_version == 2:
                if value and self.sources[name] == "argument":
                    if name == "forward_prefetch":
                        raise ConfigError(
                            "fsdp forward_prefetch is an FSDP1 setting; FSDP2 prefetches on its own, so leave it unset "
                            "with fsdp_version=2"
                        )
                    self._warn_v1_only(name, None)
                elif value:
                    self._warn_v1_only(name, variable)
                value = None  # FSDP2 has no such knob; values from an FSDP1 config file must not be errors
            setattr(self, name, value)
        for name in ("activation_checkpointing", "activation_checkpointing_offload", "cpu_ram_efficient_loading"):
            value, variable = self._pick(name, False)
            setattr(self, name, _bool(value, name, variable))
        if self.activation_checkpointing_offload and not self.activation_checkpointing:
            raise ConfigError(
                "fsdp activation_checkpointing_offload=True needs activation_checkpointing=True as well"
            )
        if self.activation_checkpointing_offload and self.fsdp_version != 2:
            raise ConfigError("`activation_checkpointing_offload=True` requires `fsdp_version=2`.")
        if self.fsdp_version == 1 and self.cpu_ram_efficient_loading and not self.sync_module_states:
            # As Accelerate (its words): the other ranks start from empty weights and need rank 0's. A false value
            # the user set is refused under hasten's strict setting.
            from .resolve import strict

            if strict() and self.sources.get("sync_module_states") != "default":
                raise ConfigError(f"fsdp cpu_ram_efficient_loading is true but sync_module_states is false (from "
                                  f"{self.sources['sync_module_states']}), so ranks other than 0 would keep empty "
                                  "weights; fix: set sync_module_states to true (an error under hasten's strict setting)")
            warnings.warn("sync_module_states cannot be False since efficient cpu ram loading enabled. Setting "
                          "sync_module_states to True.", stacklevel=4)
            self.sync_module_states = True
        if self.sources.get("cpu_ram_efficient_loading") == "argument":
            # transformers' from_pretrained reads this variable to build the model on the meta device; Accelerate
            # writes Python's spelling ("True"/"False"), which scripts compare.
            os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] = str(self.cpu_ram_efficient_loading)

    def _resolve_auto_wrap(self):
        value, variable = self._pick("auto_wrap_policy", "no_wrap")
        if isinstance(value, str):
            name = value.strip().lower()
            if name not in _AUTO_WRAP_NAMES:
                raise ConfigError(
                    f"fsdp auto_wrap_policy={value!r} (from {_source(variable)}) is not valid; choose one of "
                    f"{', '.join(n.upper() for n in _AUTO_WRAP_NAMES)} or pass a callable"
                )
            value = None if name == "no_wrap" else name
        elif not callable(value):
            raise ConfigError(f"fsdp auto_wrap_policy must be a name or a callable, got {type(value).__name__}")
        self.auto_wrap_policy = value

        names, variable = self._pick("transformer_cls_names_to_wrap", None, "transformer_cls_to_wrap")
        if isinstance(names, str):
            names = [n.strip() for n in names.split(",") if n.strip()]
        self.transformer_cls_names_to_wrap = list(names) if names is not None else None

        count, variable = self._pick("min_num_params", 0)
        try:
            self.min_num_params = parse_int(count)
        except (TypeError, ValueError):
            raise ConfigError(
                f"fsdp min_num_params={count!r} (from {_source(variable)}) must be an integer"
            ) from None
        if self.min_num_params < 0:
            raise ConfigError(f"fsdp min_num_params={count!r} must not be negative")

    def _resolve_state_dict_type(self):
        default = "FULL_STATE_DICT" if self.fsdp_version == 1 else "SHARDED_STATE_DICT"
        value, variable = self._pick("state_dict_type", default)
        self.set_state_dict_type(_enum(StateDictType, value, "state_dict_type", variable))

    def _resolve_prefetch(self):
        value, variable = self._pick("backward_prefetch", None)
        if value is not None and str(value).strip().upper() == "NO_PREFETCH":
            value = None
        if value is not None:
            value = _enum(BackwardPrefetch, value, "backward_prefetch", variable)
            if self.fsdp_version == 2:
                self._warn_v1_only("backward_prefetch", variable)
                value = None
        self.backward_prefetch = value

    def _resolve_ignored_modules(self):
        value, _ = self._pick("ignored_modules", None)
        if value is not None and not isinstance(value, str):
            value = list(value)
            bad = [type(m).__name__ for m in value if not isinstance(m, torch.nn.Module)]
            if bad:
                raise ConfigError(f"fsdp ignored_modules must be modules or a regex string; got {', '.join(bad)}")
        elif isinstance(value, str):
            try:
                re.compile(value)
            except re.error as error:
                raise ConfigError(f"fsdp ignored_modules={value!r} is not a valid regular expression: {error}") from None
        self.ignored_modules = value

    # -- converters ---------------------------------------------------------------------------------------
    def _offload_policy(self, value):
        """The version's offload object from a bool (or from FSDP_OFFLOAD_PARAMS)."""
        from torch.distributed.fsdp import CPUOffload, CPUOffloadPolicy, OffloadPolicy

        variable = None
        if value is None:
            text, variable = _env("offload_params")
            value = False if text is None else _bool(text, "offload_params", variable)
            self.sources["cpu_offload"] = _source(variable) if variable else "default"
        else:
            self.sources["cpu_offload"] = "argument"
        if isinstance(value, bool):
            if self.fsdp_version == 1:
                return CPUOffload(offload_params=value)
            return CPUOffloadPolicy() if value else OffloadPolicy()
        expected = CPUOffload if self.fsdp_version == 1 else OffloadPolicy
        if not isinstance(value, expected):
            raise ConfigError(
                f"fsdp cpu_offload={value!r} does not fit fsdp_version={self.fsdp_version}; pass a bool or a "
                f"{expected.__name__}"
            )
        return value

    @property
    def meets_cpu_tensors(self) -> bool:
        """Whether torch's own collectives meet CPU tensors in this run (the offloaded gradients' norm, a full state
        dict gathered to CPU memory): the default process group must then serve both devices ("cuda:nccl,cpu:gloo"),
        the rule Accelerate applies to its launcher's variables (`distributed.cluster.choose_backend`)."""
        return self.offloads_params or self.state_dict_type == StateDictType.FULL_STATE_DICT

    @property
    def offloads_params(self) -> bool:
        from torch.distributed.fsdp import CPUOffloadPolicy

        if self.fsdp_version == 1:
            return bool(getattr(self.cpu_offload, "offload_params", False))
        return isinstance(self.cpu_offload, CPUOffloadPolicy)

    def _mixed_precision(self, value):
        """The version's mixed-precision object from a name, a dict of dtypes or the object itself."""
        from torch.distributed.fsdp import MixedPrecision, MixedPrecisionPolicy

        target = MixedPrecision if self.fsdp_version == 1 else MixedPrecisionPolicy
        if isinstance(value, target):
            return value
        if isinstance(value, (MixedPrecision, MixedPrecisionPolicy)):
            raise ConfigError(
                f"fsdp mixed_precision_policy is a {type(value).__name__} but fsdp_version={self.fsdp_version} "
                f"needs a {target.__name__} (or a name such as 'bf16', or a dict of dtypes)"
            )
        if isinstance(value, str):
            key = value.strip().lower()
            if key not in PRECISION_DTYPES:
                raise ConfigError(
                    f"fsdp mixed_precision_policy={value!r} is not valid; choose one of fp32, bf16, fp16, fp8 or "
                    "pass a dict of dtypes"
                )
            value = self._policy_fields(PRECISION_DTYPES[key])
        if not isinstance(value, dict):
            raise ConfigError(f"fsdp mixed_precision_policy must be a name, a dict or a {target.__name__}")
        allowed = {"param_dtype", "reduce_dtype"} | ({"buffer_dtype"} if self.fsdp_version == 1 else {"output_dtype"})
        unknown = set(value) - allowed
        if unknown:
            raise ConfigError(
                f"fsdp mixed_precision_policy keys {sorted(unknown)} are not valid for fsdp_version="
                f"{self.fsdp_version}; allowed: {sorted(allowed)}"
            )
        for key, dtype in value.items():
            if dtype is not None and not isinstance(dtype, torch.dtype):
                raise ConfigError(f"fsdp mixed_precision_policy[{key!r}] must be a torch.dtype, got {dtype!r}")
        return target(**value)

    # -- Accelerate's methods -----------------------------------------------------------------------------
    def set_state_dict_type(self, state_dict_type=None):
        """Choose FULL / SHARDED (/ LOCAL for FSDP1) checkpoints and the matching configs."""
        from torch.distributed.fsdp import (
            FullOptimStateDictConfig,
            FullStateDictConfig,
            ShardedOptimStateDictConfig,
            ShardedStateDictConfig,
        )

        if state_dict_type is not None:
            self.state_dict_type = _enum(StateDictType, state_dict_type, "state_dict_type", None)
        if self.state_dict_type == StateDictType.LOCAL_STATE_DICT and self.fsdp_version == 2:
            raise ConfigError(
                "fsdp state_dict_type=LOCAL_STATE_DICT does not exist for fsdp_version=2; use SHARDED_STATE_DICT "
                "(resharding checkpoints) or FULL_STATE_DICT"
            )
        # CPU offload of the gathered state is what we want on any device; rank0_only keeps the other
        # processes from each holding a whole copy.
        if self.state_dict_type == StateDictType.FULL_STATE_DICT:
            self.state_dict_config = self.state_dict_config or FullStateDictConfig(offload_to_cpu=True, rank0_only=True)
            self.optim_state_dict_config = self.optim_state_dict_config or FullOptimStateDictConfig(
                offload_to_cpu=True, rank0_only=True)
        elif self.state_dict_type == StateDictType.SHARDED_STATE_DICT:
            self.state_dict_config = self.state_dict_config or ShardedStateDictConfig(offload_to_cpu=True)
            self.optim_state_dict_config = self.optim_state_dict_config or ShardedOptimStateDictConfig(offload_to_cpu=True)

    def _policy_fields(self, dtype, buffer_autocast: bool = False) -> dict:
        """Accelerate's policy for one precision: parameters, gradient reduction and (FSDP1) buffers or (FSDP2)
        outputs all in `dtype`. Accelerate's `buffer_autocast=True` keeps FSDP1 buffers in fp32 (the flag does
        the opposite of its name; kept so scripts see the same dtypes)."""
        fields = {"param_dtype": dtype, "reduce_dtype": dtype}
        if self.fsdp_version == 1:
            fields["buffer_dtype"] = torch.float32 if buffer_autocast else dtype
        else:
            fields["output_dtype"] = dtype
        return fields

    def set_mixed_precision(self, mixed_precision, buffer_autocast: bool = False, override: bool = False):
        """Fill the policy from the run's mixed precision ("bf16"/"fp16"), unless one was given (or `override`).

        As in Accelerate, gradients are reduced in the low precision too. To reduce them in fp32 (hasten's
        advice: summing bf16 gradients across ranks loses bits), give the plugin a policy, e.g.
        `mixed_precision_policy={"param_dtype": torch.bfloat16, "reduce_dtype": torch.float32}`."""
        if self.mixed_precision_policy is not None and not override:
            return
        if isinstance(mixed_precision, torch.dtype):
            dtype = mixed_precision
        else:
            key = str(mixed_precision).lower()
            if key not in PRECISION_DTYPES:
                raise ConfigError(f"mixed precision {mixed_precision!r} is not valid for FSDP; choose one of "
                                  f"{', '.join(PRECISION_DTYPES)}")
            dtype = PRECISION_DTYPES[key]
        if dtype is None or dtype == torch.float32:
            if override:
                self.mixed_precision_policy = None
            return
        self.mixed_precision_policy = self._mixed_precision(self._policy_fields(dtype, buffer_autocast))

    def validate_mixed_precision_policy(self):
        if self.mixed_precision_policy is not None:
            self.mixed_precision_policy = self._mixed_precision(self.mixed_precision_policy)

    def set_cpu_offload(self):
        self.cpu_offload = self._offload_policy(self.offloads_params)

    def validate_cpu_offload(self):
        self.cpu_offload = self._offload_policy(self.cpu_offload)

    # -- which submodules form their own shard group --------------------------------------------------------
    def set_auto_wrap_policy(self, model: torch.nn.Module) -> None:
        """Accelerate's step before sharding `model`: TRANSFORMER_BASED_WRAP without class names takes the model's
        `_no_split_modules`, and each name must be a class in the model (Accelerate's words). The policy itself
        stays a name here; `wrap_predicate(model)` is the test a module passes to get its own unit."""
        if self.auto_wrap_policy != "transformer_based_wrap":
            return
        if self.transformer_cls_names_to_wrap is None:
            self.transformer_cls_names_to_wrap = list(getattr(model, "_no_split_modules", None) or [])
        for name in self.transformer_cls_names_to_wrap:
            if get_module_class_from_name(model, name) is None:
                raise ConfigError(f"Could not find the transformer layer class {name} in the model. (fsdp "
                                  f"transformer_cls_names_to_wrap names {name!r}; fix the name or the model)")

    def wrap_predicate(self, model: torch.nn.Module) -> Optional[Callable[[torch.nn.Module], bool]]:
        """`module -> bool`: whether a submodule gets its own FSDP unit; None when only the root is wrapped."""
        policy = self.auto_wrap_policy
        if policy is None:
            return None
        if callable(policy):
            return functools.partial(_call_user_policy, policy)
        if policy == "transformer_based_wrap":
            names = self.transformer_cls_names_to_wrap or list(getattr(model, "_no_split_modules", None) or [])
            if not names:
                raise ConfigError(
                    "fsdp auto_wrap_policy=TRANSFORMER_BASED_WRAP needs transformer_cls_names_to_wrap (or "
                    "--fsdp_transformer_layer_cls_to_wrap), e.g. 'Block'; the model has no _no_split_modules"
                )
            present = {type(m).__name__ for m in model.modules()}
            missing = [n for n in names if n not in present]
            if missing:
                raise ConfigError(
                    f"fsdp transformer_cls_names_to_wrap names {missing} but the model has no module of that class; "
                    f"its classes are: {', '.join(sorted(present))}"
                )
            wanted = set(names)
            return lambda module: type(module).__name__ in wanted
        threshold = self.min_num_params
        if threshold <= 0:
            return None  # Accelerate: min_num_params=0 turns the size policy off
        return lambda module: sum(p.numel() for p in module.parameters()) >= threshold


def _call_user_policy(policy, module: torch.nn.Module) -> bool:
    """Ask a user policy about one module: FSDP1-style `(module, recurse, nonwrapped_numel)` or `(module)`."""
    import inspect

    try:
        takes_one = len(inspect.signature(policy).parameters) == 1
    except (TypeError, ValueError):  # builtins and some C callables have no signature
        takes_one = False
    if takes_one:
        return bool(policy(module))
    numel = sum(p.numel() for p in module.parameters())
    return bool(policy(module=module, recurse=False, nonwrapped_numel=numel))


def get_module_class_from_name(module: torch.nn.Module, name: str):
    """The class of the first submodule of `module` (itself included, depth first) whose class is called `name`,
    or None. Auto-wrap policies built outside hasten (peft's) turn `_no_split_modules` names into classes with it."""
    for submodule in module.modules():
        if type(submodule).__name__ == name:
            return type(submodule)
    return None

