"""DeepSpeed settings with Accelerate's names: `DeepSpeedPlugin` and the filling of a DeepSpeed config's `"auto"`
values (the config itself, `HfDeepSpeedConfig`, is `hasten.config.deepspeed_config`; the placeholders
`DummyOptim`/`DummyScheduler` are in `backends/deepspeed/dummies.py`, Ulysses' `DeepSpeedSequenceParallelConfig` in
`hasten.config.sequence_parallel`).

Nothing here imports deepspeed: a plugin can be built, checked and printed on a machine without it.

One rule for every value that can be given in two places (the DeepSpeed config, a `DeepSpeedPlugin`
field, a launcher variable, an `Accelerator` argument, what `prepare` sees): an `"auto"` or missing entry
is filled, an equal one is fine, and two different numbers are a `ConfigError` naming both sources.
Accelerate lets one of them win silently (the config usually); hasten refuses to guess.
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import warnings
from dataclasses import dataclass, field
from typing import Any, Optional

from ..core.errors import ConfigError, NotSupportedYetError
from ..core.env import parse_bool, parse_int
from .deepspeed_config import AUTO, HfDeepSpeedConfig

OFFLOAD_DEVICES = ("none", "cpu", "nvme")

# plugin field -> the DeepSpeed config key it sets
PLUGIN_KEYS = {
    "gradient_accumulation_steps": "gradient_accumulation_steps",
    "gradient_clipping": "gradient_clipping",
    "zero_stage": "zero_optimization.stage",
    "offload_optimizer_device": "zero_optimization.offload_optimizer.device",
    "offload_param_device": "zero_optimization.offload_param.device",
    "offload_optimizer_nvme_path": "zero_optimization.offload_optimizer.nvme_path",
    "offload_param_nvme_path": "zero_optimization.offload_param.nvme_path",
    "zero3_save_16bit_model": "zero_optimization.stage3_gather_16bit_weights_on_model_save",
}
# plugin field -> its row in the settings table (hasten.config.settings), whose variables `hasten launch` writes
ENV_SETTINGS = {
    "hf_ds_config": "deepspeed_config_file",
    "gradient_accumulation_steps": "gradient_accumulation_steps",
    "gradient_clipping": "gradient_clipping",
    "zero_stage": "zero_stage",
    "offload_optimizer_device": "offload_optimizer_device",
    "offload_param_device": "offload_param_device",
    "offload_optimizer_nvme_path": "offload_optimizer_nvme_path",
    "offload_param_nvme_path": "offload_param_nvme_path",
    "zero3_init_flag": "zero3_init_flag",
    "zero3_save_16bit_model": "zero3_save_16bit_model",
    "transformer_moe_cls_names": "deepspeed_moe_layer_cls_names",
}
# What an unset field means (Accelerate's defaults).
DEFAULTS = {
    "gradient_accumulation_steps": AUTO, "gradient_clipping": AUTO, "zero_stage": 2,
    "offload_optimizer_device": "none", "offload_param_device": "none",
    "offload_optimizer_nvme_path": "none", "offload_param_nvme_path": "none", "zero3_save_16bit_model": False,
}


# -- reading and checking plugin fields ----------------------------------------------------------------------
def _int(value, name: str, source: str, minimum: int = 0, allow_auto: bool = False):
    if allow_auto and value == AUTO:
        return value
    try:
        return parse_int(value, minimum)
    except ValueError:
        extra = ' or "auto"' if allow_auto else ""
        raise ConfigError(f"deepspeed {name}={value!r} (from {source}) must be an integer >= {minimum}{extra}") from None


def _float(value, name: str, source: str):
    if value == AUTO:
        return value
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = -1.0
    if number < 0 or math.isnan(number):
        raise ConfigError(f'deepspeed {name}={value!r} (from {source}) must be a number >= 0 or "auto"')
    return number


def _bool(value, name: str, source: str) -> bool:
    try:
        return parse_bool(value)
    except ValueError:
        raise ConfigError(f"deepspeed {name}={value!r} (from {source}) must be true or false") from None


def _check_field(name: str, value, source: str):
    if name == "gradient_accumulation_steps":
        return _int(value, name, source, minimum=1, allow_auto=True)
    if name == "gradient_clipping":
        return _float(value, name, source)
    if name == "zero_stage":
        try:
            stage = parse_int(value, 0)
        except ValueError:
            stage = None
        if stage is None or stage > 3:
            raise ConfigError(f"deepspeed zero_stage={value!r} (from {source}) must be 0, 1, 2 or 3")
        return stage
    if name in ("offload_optimizer_device", "offload_param_device"):
        text = str(value).lower()
        if text not in OFFLOAD_DEVICES:
            raise ConfigError(f"deepspeed {name}={value!r} (from {source}) must be one of {', '.join(OFFLOAD_DEVICES)}")
        return text
    if name in ("zero3_init_flag", "zero3_save_16bit_model"):
        return _bool(value, name, source)
    return value


def _from_environment(setting: str):
    """The table's value of `setting` when a variable gives it (the launcher's export), else None."""
    from .resolve import runtime_value

    try:
        resolved = runtime_value(setting)
    except ValueError as error:  # a variable that does not parse: say which setting of the plugin reads it
        raise ConfigError(f"DeepSpeedPlugin: {error}") from None
    # Inside `hasten launch` the launcher's record names the flag or config-file key the variable came from.
    return None if resolved.source in ("default", "code") else resolved


def _describe(resolved) -> str:
    if resolved.source == "environment":
        return f"environment variable {resolved.origin}"
    return {"flag": f"launch flag {resolved.origin}", "file": f"config file {resolved.origin}"}.get(
        resolved.source, resolved.origin)


def _conflict(key: str, first, first_source: str, second, second_source: str) -> ConfigError:
    return ConfigError(
        f"DeepSpeed {key} is {first!r} in {first_source} but {second!r} in {second_source}; give it in one place "
        f'(or set it to "auto" in the DeepSpeed config)'
    )


def _same(a, b) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return bool(a) == bool(b) if isinstance(a, bool) and isinstance(b, bool) else str(a).lower() == str(b).lower()
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    return str(a).lower() == str(b).lower()


@dataclass
class DeepSpeedPlugin:
    """How to train with DeepSpeed ZeRO (stage 0-3, offload, gradient accumulation and clipping).

    Give a DeepSpeed config (`hf_ds_config`: dict, JSON path or string) for full control, or only the fields
    below for a generated one. Unset fields come from `HASTEN_*`/`ACCELERATE_*` variables written by
    `hasten launch --use_deepspeed`, else from Accelerate's defaults (ZeRO-2, no offload).
    """

    hf_ds_config: Any = None
    gradient_accumulation_steps: Any = None
    gradient_clipping: Any = None
    zero_stage: Optional[int] = None
    is_train_batch_min: bool = True
    offload_optimizer_device: Optional[str] = None
    offload_param_device: Optional[str] = None
    offload_optimizer_nvme_path: Optional[str] = None
    offload_param_nvme_path: Optional[str] = None
    zero3_init_flag: Optional[bool] = None
    zero3_save_16bit_model: Optional[bool] = None
    transformer_moe_cls_names: Optional[str] = None
    enable_msamp: Optional[bool] = None
    msamp_opt_level: Optional[str] = None
    # config key -> where its concrete value came from (for error messages)
    _sources: dict = field(default_factory=dict, init=False, repr=False)
    # field -> why its value (kept as given, as Accelerate keeps it) cannot run; refused at prepare
    _unusable: dict = field(default_factory=dict, init=False, repr=False)
    dschf: Any = field(default=None, init=False, repr=False)  # transformers' config, while registered

    def __post_init__(self):
        given = self._read_fields()
        if self.enable_msamp is None:
            self.enable_msamp = str(os.environ.get("ACCELERATE_FP8_BACKEND", "")).upper() == "MSAMP"
        if self.enable_msamp:
            raise NotSupportedYetError("DeepSpeedPlugin(enable_msamp=True): MS-AMP is not supported by hasten yet")
        if self.msamp_opt_level is not None:  # it only tunes MS-AMP, which is refused above: never silently dropped
            raise NotSupportedYetError(f"DeepSpeedPlugin(msamp_opt_level={self.msamp_opt_level!r}): MS-AMP is not "
                                       "supported by hasten yet; drop msamp_opt_level")
        self.msamp_opt_level = "O1"
        if self.hf_ds_config is not None and self.hf_ds_config != "none":
            self._use_config(given)
        else:
            self._build_config()
        self.deepspeed_config = self.hf_ds_config.config
        self.deepspeed_config["steps_per_print"] = float("inf")  # DeepSpeed would print every 10 steps
        self._resolve_zero3_init(given)
        self._selected = False

    # -- construction --------------------------------------------------------------------------------------
    def _read_fields(self) -> dict:
        """Fill unset fields from the environment or the defaults; return {field: source} for given ones."""
        given = {}
        for name, setting in ENV_SETTINGS.items():
            value = getattr(self, name)
            if value is not None:
                given[name] = f"DeepSpeedPlugin({name}={value!r})"
            else:
                resolved = _from_environment(setting)
                unset = ("", "none") if name in ("hf_ds_config", "offload_optimizer_nvme_path", "offload_param_nvme_path") else ("",)
                if resolved is not None and str(resolved.value).strip().lower() not in unset:
                    value = resolved.value
                    given[name] = _describe(resolved)
            if value is None:
                value = DEFAULTS.get(name)
            if name != "hf_ds_config" and value is not None:
                value = self._checked(name, value, given.get(name, "the default"))
            setattr(self, name, value)
        return given

    def _checked(self, name: str, value, source: str):
        """The field's value, checked. Accelerate stores an argument as given (`zero_stage="zero2"`) and only
        DeepSpeed trips over it; so does hasten, and `prepare` refuses it in one line before DeepSpeed starts
        (`check_usable`). Under hasten's `strict` setting it is refused here. A variable is checked here always
        (Accelerate converts those and fails on a bad one too)."""
        try:
            return _check_field(name, value, source)
        except ConfigError as error:
            from .resolve import strict

            if not source.startswith("DeepSpeedPlugin(") or strict():
                raise
            self._unusable[name] = str(error)
            return value

    def check_usable(self) -> None:
        """Refuse, in one line, a field value DeepSpeed cannot run with (kept as given at construction)."""
        for message in self._unusable.values():
            raise ConfigError(f"{message} (hasten's strict setting refuses it when the plugin is built)")

    def _use_config(self, given: dict) -> None:
        given_as = self.hf_ds_config
        is_file = isinstance(given_as, (str, os.PathLike)) and os.path.isfile(os.path.expanduser(os.fspath(given_as)))
        source = f"DeepSpeed config {os.fspath(given_as)}" if is_file else "the DeepSpeed config (hf_ds_config)"
        if not isinstance(self.hf_ds_config, HfDeepSpeedConfig):
            self.hf_ds_config = HfDeepSpeedConfig(self.hf_ds_config)
        config = self.hf_ds_config.config
        if "zero_optimization" not in config:
            raise ConfigError(f"Please specify the ZeRO optimization config in the DeepSpeed config. ({source} has no "
                              '"zero_optimization" section; add one, e.g. {"stage": 2})')
        _refuse_fields_beside_config_file()
        for key, value in _walk(config):
            if value != AUTO:
                self._sources[key] = source
        if "gradient_accumulation_steps" not in config:
            # As Accelerate: a config without it trains with 1 (an Accelerator asking for more is warned at
            # prepare and uses the config's 1, or refused under hasten's strict setting).
            config["gradient_accumulation_steps"] = 1
            self._sources["gradient_accumulation_steps"] = f"{source} (which lacks it: 1, as in Accelerate)"
        for name, key in PLUGIN_KEYS.items():
            if name not in given:
                continue
            value = getattr(self, name)
            if value == AUTO or (name.endswith("nvme_path") and value == "none"):
                continue
            self._fill(key, value, given[name])
        self.hf_ds_config.set_stage_and_offload()
        for name, key in PLUGIN_KEYS.items():  # the config's concrete values become the plugin's fields
            value = self.hf_ds_config.get_value(key)
            if value is not None and value != AUTO:
                setattr(self, name, value)
        self.zero_stage = self.hf_ds_config.get_value("zero_optimization.stage", self.zero_stage)

    def _build_config(self) -> None:
        optimizer = {"device": self.offload_optimizer_device}
        if self.offload_optimizer_device == "nvme":
            optimizer["nvme_path"] = self.offload_optimizer_nvme_path
        param = {"device": self.offload_param_device}
        if self.offload_param_device == "nvme":
            param["nvme_path"] = self.offload_param_nvme_path
        config = {
            "train_batch_size": AUTO,
            "train_micro_batch_size_per_gpu": AUTO,
            "gradient_accumulation_steps": self.gradient_accumulation_steps,
            "zero_optimization": {
                "stage": self.zero_stage,
                "offload_optimizer": optimizer,
                "offload_param": param,
                "stage3_gather_16bit_weights_on_model_save": self.zero3_save_16bit_model,
            },
        }
        if self.gradient_clipping:
            config["gradient_clipping"] = self.gradient_clipping
        self.hf_ds_config = HfDeepSpeedConfig(config)
        for key, value in _walk(config):
            if value != AUTO:
                self._sources[key] = "DeepSpeedPlugin"

    def _resolve_zero3_init(self, given: dict) -> None:
        is_zero3 = self.hf_ds_config.is_zero3()
        if self.zero3_init_flag is None:
            self.zero3_init_flag = is_zero3
        if self.zero3_init_flag and not is_zero3:
            # Accelerate warns and turns the flag off (configs in the wild carry it on every stage); nothing
            # runs differently, so hasten does the same and refuses it only under its strict setting.
            from .resolve import strict

            if strict():
                raise ConfigError(
                    f"deepspeed zero3_init_flag is true (from {given.get('zero3_init_flag', 'the default')}) but the "
                    f"ZeRO stage is {self.zero_stage}; it only applies to stage 3: set zero_stage=3 or drop "
                    "zero3_init_flag (an error under hasten's strict setting)"
                )
            warnings.warn("DeepSpeed Zero3 Init flag is only applicable for ZeRO Stage 3. Setting it to False.")
            self.zero3_init_flag = False

    # -- filling values ------------------------------------------------------------------------------------
    def _fill(self, ds_key_long: str, value, source: str, must_match: bool = True) -> None:
        """Set `ds_key_long` to `value` unless the config already holds a concrete value: a different one is an
        error when `must_match` (a value the user gave), else the config's stands (a default)."""
        config, key = self.hf_ds_config.find_config_node(ds_key_long)
        if config is None:
            config = self.hf_ds_config.config
            for part in ds_key_long.split(".")[:-1]:
                config = config.setdefault(part, {})
        current = config.get(key)
        if must_match and current is not None and current != AUTO and not _same(current, value):
            raise _conflict(ds_key_long, current, self._sources.get(ds_key_long, "the DeepSpeed config"), value, source)
        if current is None or current == AUTO:
            config[key] = value
            self._sources[ds_key_long] = source

    def fill_auto(self, values: dict, source, must_match: bool = True) -> None:
        """`values` = {dotted key: value}: fill each "auto" entry; with `must_match`, an existing different number
        is an error naming both sources. `source` is one description or {key: description}."""
        for key, value in values.items():
            config, last = self.hf_ds_config.find_config_node(key)
            if config is None or last not in config:
                continue
            self._fill(key, value, source if isinstance(source, str) else source[key], must_match)

    def source_of(self, ds_key_long: str) -> str:
        return self._sources.get(ds_key_long, "the DeepSpeed config")

    def fill_match(self, ds_key_long, mismatches=None, must_match=True, **kwargs):
        """Accelerate's helper: fill an "auto" `ds_key_long` from kwargs; record a mismatch when `must_match`."""
        config, key = self.hf_ds_config.find_config_node(ds_key_long)
        if config is None:
            return
        if config.get(key) == AUTO:
            if ds_key_long not in kwargs:
                raise ConfigError(  # Accelerate's words first (scripts match them)
                    f"`{ds_key_long}` not found in kwargs. Please specify `{ds_key_long}` without `auto` (set to "
                    "correct value) in the DeepSpeed config file or pass it in kwargs."
                )
            config[key] = kwargs[ds_key_long]
            return
        if must_match and ds_key_long in kwargs and config.get(key) is not None:
            if not _same(config[key], kwargs[ds_key_long]) and mismatches is not None:
                mismatches.append(f"- ds {ds_key_long}={config[key]} vs arg {ds_key_long}={kwargs[ds_key_long]}")

    def deepspeed_config_process(self, prefix="", mismatches=None, config=None, must_match=True, **kwargs):
        """Fill every "auto" entry of the config from kwargs; raise listing all mismatches."""
        top = mismatches is None
        mismatches = [] if mismatches is None else mismatches
        config = self.deepspeed_config if config is None else config
        for key, value in config.items():
            if isinstance(value, dict):
                self.deepspeed_config_process(prefix + key + ".", mismatches, value, must_match, **kwargs)
            else:
                self.fill_match(prefix + key, mismatches, must_match=must_match, **kwargs)
        if top and mismatches:
            raise ConfigError(
                "Please correct the following DeepSpeed config values that mismatch kwargs values: "
                + "; ".join(m.lstrip("- ") for m in mismatches)
                + ". The easiest method is to set these DeepSpeed config values to 'auto'."
            )

    def is_auto(self, ds_key_long: str) -> bool:
        return self.hf_ds_config.get_value(ds_key_long) == AUTO

    def get_value(self, ds_key_long: str, default=None):
        return self.hf_ds_config.get_value(ds_key_long, default)

    # -- precision -----------------------------------------------------------------------------------------
    def set_mixed_precision(self, mixed_precision: str, source: str = "the mixed_precision setting") -> None:
        """Write the run's precision into the config's fp16/bf16 blocks; a config that enables another is an error."""
        config = self.deepspeed_config
        if mixed_precision == "fp8":
            raise NotSupportedYetError("mixed_precision='fp8' with DeepSpeed is not supported by hasten yet")
        wanted = {"fp16": mixed_precision == "fp16", "bf16": mixed_precision == "bf16"}
        for dtype in ("fp16", "bf16"):
            block = config.setdefault(dtype, {})
            if not isinstance(block, dict):
                raise ConfigError(f'DeepSpeed config "{dtype}" must be a section like {{"enabled": true}}')
            enabled = block.get("enabled", AUTO if wanted[dtype] else False)
            if enabled == AUTO:
                block["enabled"] = wanted[dtype]
                if dtype == "fp16" and wanted[dtype]:
                    block.setdefault("auto_cast", True)
                continue
            on = _bool(enabled, f"{dtype}.enabled", self.source_of(f"{dtype}.enabled"))
            block["enabled"] = on
            if wanted[dtype] and not on and f"{dtype}.enabled" in self._sources:
                raise _conflict(f"{dtype}.enabled", False, self.source_of(f"{dtype}.enabled"), True,
                                f"{source} ({mixed_precision})")
            if on and mixed_precision not in ("no", dtype):
                raise ConfigError(  # Accelerate's words first (scripts match them)
                    f"`--mixed_precision` arg cannot be set to `{mixed_precision}` when `{dtype}` is set in the "
                    f"DeepSpeed config file. ({dtype}.enabled is true in {self.source_of(f'{dtype}.enabled')}; "
                    f"{source} asks for {mixed_precision})")
            if wanted[dtype] and not on:
                block["enabled"] = True
        if config["fp16"]["enabled"] and config["bf16"]["enabled"]:
            raise ConfigError("DeepSpeed config enables both fp16 and bf16; enable one of them")
        if self.dschf is not None:  # transformers holds a copy of the config: give it the filled switches
            self.set_deepspeed_weakref()

    @property
    def mixed_precision(self) -> str:
        """The precision the engine trains in, from the config's fp16/bf16 blocks."""
        for dtype in ("fp16", "bf16"):
            block = self.deepspeed_config.get(dtype)
            if isinstance(block, dict) and block.get("enabled") is True:
                return dtype
        return "no"

    # -- ZeRO-3 construction -------------------------------------------------------------------------------
    def is_zero3_init_enabled(self) -> bool:
        return bool(self.zero3_init_flag)

    def set_deepspeed_weakref(self) -> None:
        """Let transformers' `from_pretrained` build models partitioned (ZeRO-3 init), as Accelerate does."""
        if not _transformers_sees_accelerate():
            # Without transformers no model is built through it (Accelerate raises here when zero3_init_flag is
            # on); without the accelerate alias (`hasten alias install`) transformers' DeepSpeed config refuses
            # to start and its from_pretrained would not reach hasten anyway.
            return
        if self.hf_ds_config.is_zero3() and not self.zero3_init_flag:
            # transformers builds under zero.Init whenever its registered config is ZeRO-3; a flag turned off
            # (zero3_init_context_manager(enable=False)) must keep it from doing so. (Accelerate registers it anyway.)
            return
        # As Accelerate: the selected plugin's config is transformers' DeepSpeed config, so
        # `transformers.integrations.deepspeed_config()` shows it.
        from transformers.integrations import HfDeepSpeedConfig as TransformersConfig, unset_hf_deepspeed_config

        unset_hf_deepspeed_config()

        config = copy.deepcopy(self.deepspeed_config)
        steps = config.get("gradient_accumulation_steps")
        steps = steps if isinstance(steps, int) else 1
        if config.get("train_micro_batch_size_per_gpu") == AUTO:
            config["train_micro_batch_size_per_gpu"] = 1
        if config.get("train_batch_size") == AUTO:  # as Accelerate: transformers' copy leaves it out
            del config["train_batch_size"]
        config["gradient_accumulation_steps"] = steps
        self.dschf = TransformersConfig(config)

    @contextlib.contextmanager
    def zero3_init_context_manager(self, enable: bool = False):
        """Within the block, ZeRO-3 init is turned on or off (for models built by transformers)."""
        saved = self.zero3_init_flag
        if saved == enable:
            yield
            return
        self.zero3_init_flag = enable
        self.dschf = None
        self.set_deepspeed_weakref()
        try:
            yield
        finally:
            self.zero3_init_flag = saved
            self.dschf = None
            self.set_deepspeed_weakref()

    def set_moe_leaf_modules(self, model) -> None:
        """Mark the named MoE block classes as ZeRO-3 leaves (gathered whole), as Accelerate does."""
        names = self.transformer_moe_cls_names
        if not names:
            return
        wanted = {name.strip() for name in str(names).split(",") if name.strip()}
        classes = {type(m) for m in model.modules() if type(m).__name__ in wanted}
        missing = wanted - {c.__name__ for c in classes}
        if missing:
            raise ConfigError(
                f"transformer_moe_cls_names lists {', '.join(sorted(missing))}, which the model does not contain"
            )
        from deepspeed.utils import set_z3_leaf_modules

        set_z3_leaf_modules(model, list(classes))

    # -- several plugins -----------------------------------------------------------------------------------
    @property
    def selected(self) -> bool:
        return self._selected

    @selected.setter
    def selected(self, value):
        raise NotImplementedError("select a plugin with AcceleratorState().select_deepspeed_plugin(name)")

    def select(self, _from_accelerator_state: bool = False) -> None:
        if not _from_accelerator_state:
            raise ConfigError(
                "a DeepSpeedPlugin is selected through AcceleratorState().select_deepspeed_plugin(name) (or "
                "Accelerator.state.select_deepspeed_plugin), not directly"
            )
        self.set_deepspeed_weakref()
        self._selected = True

    def _unselect(self) -> None:
        self._selected = False


# What Accelerate's launcher names in ACCELERATE_CONFIG_DS_FIELDS (the deepspeed_config keys of its config file) that
# a DeepSpeed config file would silently override: Accelerate refuses them together, in these words.
_FIELDS_BESIDE_CONFIG_FILE = ("gradient_accumulation_steps", "gradient_clipping", "zero_stage",
                              "offload_optimizer_device", "offload_param_device", "offload_param_nvme_path",
                              "offload_optimizer_nvme_path", "zero3_save_16bit_model", "mixed_precision")


def _refuse_fields_beside_config_file() -> None:
    from .resolve import runtime_value

    listed = str(runtime_value("config_ds_fields").value or "").split(",")
    if any(name.strip() in _FIELDS_BESIDE_CONFIG_FILE for name in listed):
        raise ConfigError(
            f"When using `deepspeed_config_file`, the following accelerate config variables will be ignored: "
            f"{list(_FIELDS_BESIDE_CONFIG_FILE)}. Please specify them appropriately in the DeepSpeed config file. "
            "If you are using an accelerate config file, remove others config variables mentioned in the above "
            "specified list. The easiest method is to create a new config following the questionnaire via "
            "`hasten config` (`accelerate config`). It will only ask for the necessary config variables when using "
            "`deepspeed_config_file`."
        )


def _transformers_sees_accelerate() -> bool:
    """transformers is installed and finds an `accelerate` distribution (hasten's alias, or a real one)."""
    import importlib.metadata
    import importlib.util

    if importlib.util.find_spec("transformers") is None:
        return False
    try:
        importlib.metadata.version("accelerate")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _walk(config: dict, prefix: str = ""):
    for key, value in config.items():
        if isinstance(value, dict):
            yield from _walk(value, prefix + key + ".")
        else:
            yield prefix + key, value


def plugins_from(deepspeed_plugin=None, deepspeed_plugins=None):
    """Accelerator's two spellings → None or {name: plugin} with the first one selected."""
    if deepspeed_plugin is not None and deepspeed_plugins is not None:
        raise ConfigError("pass either deepspeed_plugin or deepspeed_plugins to Accelerator, not both")
    plugins = deepspeed_plugin if deepspeed_plugin is not None else deepspeed_plugins
    if plugins is None:
        return None
    if isinstance(plugins, DeepSpeedPlugin):
        plugins = {"default": plugins}
    if not isinstance(plugins, dict) or not plugins:
        raise ConfigError("deepspeed_plugins must be a DeepSpeedPlugin or a non-empty dict {name: DeepSpeedPlugin}")
    for name, plugin in plugins.items():
        if not isinstance(plugin, DeepSpeedPlugin):
            raise ConfigError(f"deepspeed_plugins[{name!r}] is a {type(plugin).__name__}, not a DeepSpeedPlugin")
    first = next(iter(plugins.values()))
    for plugin in plugins.values():
        plugin._unselect()
    first.select(_from_accelerator_state=True)
    return plugins


def get_active_deepspeed_plugin(state):
    """The selected `DeepSpeedPlugin` of `state` (an `AcceleratorState`); ConfigError when DeepSpeed is off."""
    plugins = getattr(state, "deepspeed_plugins", None)
    if not plugins:
        raise ConfigError(
            "no DeepSpeedPlugin is active: pass Accelerator(deepspeed_plugin=...) or launch with --use_deepspeed"
        )
    if not isinstance(plugins, dict):
        return plugins
    return next(plugin for plugin in plugins.values() if plugin.selected)
