"""The fp8 recipe kwargs handlers, with Accelerate's fields and defaults.

Every field left as None is read from the settings table (`--fp8_*` launch flags, the `fp8_config` block of the
config file, `HASTEN_FP8_*` / `ACCELERATE_FP8_*` variables) and checked there, so a bad value gives the same one-line
error wherever it came from. Unlike Accelerate, building a handler never imports its library: the Accelerator checks
the library and the GPU together, once, and says both in one line (see `hasten.training.fp8`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable, Optional

from ..core.errors import ConfigError, NotBuiltError
from .handlers import KwargsHandler

MSAMP_REFUSAL = (
    "MS-AMP fp8 is not supported by hasten: MS-AMP is no longer maintained; use AORecipeKwargs (torchao, "
    "--fp8_backend ao) or TERecipeKwargs (TransformerEngine, --fp8_backend te) with mixed_precision='fp8'"
)


def _resolve(owner: str, field_name: str, setting: str, value):
    """`value` checked by the table's row for `setting`, or (None) the row's value from flag/env/default."""
    from . import settings
    from .resolve import runtime_value

    row = settings.get(setting)
    if value is None:
        return runtime_value(setting).value
    try:
        return row.convert(value)
    except ValueError as error:
        raise ConfigError(f"{owner}({field_name}={value!r}): {error}") from None


def _bools(text: str) -> tuple:
    """'false,false,true' (the table's form of override_linear_precision) -> (False, False, True)."""
    return tuple(part == "true" for part in text.split(","))


@dataclass
class AORecipeKwargs(KwargsHandler):
    """torchao float8 training: `config` (a `torchao.float8.Float8LinearConfig`) and `module_filter_func(module,
    fqn) -> bool` choosing the `nn.Linear` layers to convert (default: all but the first and last, and only those
    whose dimensions divide by 16). Without `config`, one is built from `pad_inner_dim` and
    `enable_fsdp_float8_all_gather` (both default True; the all-gather only matters, and is only switched on,
    under FSDP2)."""

    config: Optional[Any] = None
    module_filter_func: Optional[Callable] = None
    pad_inner_dim: Optional[bool] = None
    enable_fsdp_float8_all_gather: Optional[bool] = None

    def __post_init__(self):
        if self.module_filter_func is not None and not callable(self.module_filter_func):
            raise ConfigError(
                f"AORecipeKwargs(module_filter_func={self.module_filter_func!r}) must be a function "
                "(module, fqn) -> bool"
            )
        if self.config is not None:
            return
        self.pad_inner_dim = _resolve("AORecipeKwargs", "pad_inner_dim", "fp8_pad_inner_dim", self.pad_inner_dim)
        self.enable_fsdp_float8_all_gather = _resolve(
            "AORecipeKwargs", "enable_fsdp_float8_all_gather", "fp8_enable_fsdp_float8_all_gather",
            self.enable_fsdp_float8_all_gather,
        )
        from ..core.availability import is_torchao_available

        if is_torchao_available():  # without torchao the Accelerator refuses fp8 with the install hint
            from torchao.float8 import Float8LinearConfig

            self.config = Float8LinearConfig(
                pad_inner_dim=self.pad_inner_dim, enable_fsdp_float8_all_gather=self.enable_fsdp_float8_all_gather
            )


_TE_FIELDS = (
    # field, settings row
    ("use_autocast_during_eval", "fp8_use_autocast_during_eval"),
    ("margin", "fp8_margin"),
    ("interval", "fp8_interval"),
    ("fp8_format", "fp8_format"),
    ("amax_history_len", "fp8_amax_history_len"),
    ("amax_compute_algo", "fp8_amax_compute_algo"),
    ("use_mxfp8_block_scaling", "fp8_use_mxfp8_block_scaling"),
)


@dataclass
class TERecipeKwargs(KwargsHandler):
    """TransformerEngine fp8: the fields of its `DelayedScaling` recipe (or `MXFP8BlockScaling` with
    `use_mxfp8_block_scaling`), and whether fp8 stays on in evaluation mode."""

    use_autocast_during_eval: Optional[bool] = None
    margin: Optional[int] = None
    interval: Optional[int] = None
    fp8_format: Optional[str] = None
    amax_history_len: Optional[int] = None
    amax_compute_algo: Optional[str] = None
    override_linear_precision: Optional[tuple] = None
    use_mxfp8_block_scaling: Optional[bool] = None

    def __post_init__(self):
        owner = type(self).__name__
        explicit_amax = self.amax_history_len is not None or self.amax_compute_algo is not None
        for name, setting in _TE_FIELDS:
            setattr(self, name, _resolve(owner, name, setting, getattr(self, name)))
        self.override_linear_precision = self._override_linear_precision(owner)
        if self.use_mxfp8_block_scaling and explicit_amax:
            raise ConfigError(
                f"{owner}: amax_history_len and amax_compute_algo belong to delayed scaling and cannot be combined "
                "with use_mxfp8_block_scaling=True; fix: drop one of them"
            )

    def _override_linear_precision(self, owner: str) -> tuple:
        from .resolve import runtime_value

        value = self.override_linear_precision
        if value is not None or runtime_value("fp8_override_linear_precision").source != "default":
            return _bools(_resolve(owner, "override_linear_precision", "fp8_override_linear_precision", value))
        # Accelerate's launcher passes the three as separate variables
        return tuple(bool(runtime_value(f"fp8_override_{part}").value) for part in ("fprop", "dgrad", "wgrad"))


@dataclass
class MSAMPRecipeKwargs(KwargsHandler):
    """MS-AMP fp8 (Accelerate's `opt_level` O1/O2): refused, since MS-AMP is no longer maintained."""

    opt_level: Optional[str] = None

    def __post_init__(self):
        given = "" if self.opt_level is None else f"opt_level={self.opt_level!r}"  # the refusal names what was asked
        raise NotBuiltError(f"MSAMPRecipeKwargs({given}): {MSAMP_REFUSAL}")


@dataclass
class FP8RecipeKwargs(TERecipeKwargs):
    """Accelerate's older spelling (deprecated there too): `backend` 'te' gives `TERecipeKwargs`'s recipe; 'msamp'
    is refused. `backend` comes from `--fp8_backend` / `ACCELERATE_FP8_BACKEND` when not given (default 'te')."""

    opt_level: Optional[str] = None
    backend: Optional[str] = None

    def __post_init__(self):
        warnings.warn(
            "FP8RecipeKwargs is deprecated (as in Accelerate); use TERecipeKwargs or AORecipeKwargs instead",
            FutureWarning, stacklevel=3,
        )
        backend = _resolve("FP8RecipeKwargs", "backend", "fp8_backend", self.backend) or "te"
        if backend == "msamp" or self.opt_level is not None:
            raise NotBuiltError(f"FP8RecipeKwargs(backend={backend!r}): {MSAMP_REFUSAL}")
        if backend != "te":
            raise ConfigError(
                f"FP8RecipeKwargs(backend={backend!r}): this older spelling takes backend 'te' only (as in "
                "Accelerate); fix: use AORecipeKwargs() for torchao"
            )
        self.backend = "TE"
        super().__post_init__()

    def to_kwargs(self) -> dict:
        kwargs = super().to_kwargs()
        kwargs.pop("backend", None)
        kwargs.pop("opt_level", None)
        return kwargs


RECIPE_HANDLERS = (AORecipeKwargs, TERecipeKwargs, MSAMPRecipeKwargs, FP8RecipeKwargs)

__all__ = ["AORecipeKwargs", "TERecipeKwargs", "MSAMPRecipeKwargs", "FP8RecipeKwargs"]
