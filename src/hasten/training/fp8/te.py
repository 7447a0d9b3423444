"""TransformerEngine fp8: swap `nn.Linear`/`nn.LayerNorm` for TE's layers and run forward under `fp8_autocast`.

Accelerate's paths: `hasten.utils.transformer_engine` re-exports these. They need transformer_engine (installed
with CUDA; see NVIDIA's instructions) and a CUDA GPU with compute capability 8.9 or newer.
"""

from __future__ import annotations

from types import MethodType

import torch

from ...core.availability import is_transformer_engine_available
from ...core.errors import ConfigError

INSTALL_HINT = "pip install transformer_engine[pytorch] (needs CUDA), or use --fp8_backend ao (torchao)"


def _te(what: str):
    if not is_transformer_engine_available():
        raise ImportError(f"{what} needs transformer_engine, which is not installed; fix: {INSTALL_HINT}")
    import transformer_engine.pytorch as te

    return te


def _copy_into(new_module, module) -> None:
    with torch.no_grad():
        new_module.weight.copy_(module.weight)
        if getattr(module, "bias", None) is not None:
            new_module.bias.copy_(module.bias)


def convert_model(model, to_transformer_engine: bool = True, _convert_linear: bool = True, _convert_ln: bool = True):
    """Swap, in place and recursively, `nn.Linear` (both dimensions divisible by 16) and `nn.LayerNorm` layers for
    TransformerEngine's, copying their weights (or back, with `to_transformer_engine=False`).

    The swapped layers have new parameters: an optimizer built before must be pointed at them (`Accelerator.prepare`
    does it). A Linear whose dimensions do not divide by 16 stays as it is (Accelerate stops converting its siblings
    there)."""
    te = _te("convert_model")
    for name, module in model.named_children():
        replacement = None
        if to_transformer_engine and _convert_linear and type(module) is torch.nn.Linear:
            if module.in_features % 16 == 0 and module.out_features % 16 == 0:
                replacement = te.Linear(module.in_features, module.out_features, bias=module.bias is not None,
                                        params_dtype=module.weight.dtype)
        elif to_transformer_engine and _convert_ln and type(module) is torch.nn.LayerNorm:
            replacement = te.LayerNorm(module.normalized_shape[0], eps=module.eps, params_dtype=module.weight.dtype)
        elif not to_transformer_engine and _convert_linear and isinstance(module, te.Linear):
            replacement = torch.nn.Linear(module.in_features, module.out_features, bias=module.bias is not None,
                                          dtype=module.weight.dtype, device=module.weight.device)
        elif not to_transformer_engine and _convert_ln and isinstance(module, te.LayerNorm):
            replacement = torch.nn.LayerNorm(module.weight.shape[0], eps=module.eps, dtype=module.weight.dtype,
                                             device=module.weight.device)
        if replacement is None:
            convert_model(module, to_transformer_engine, _convert_linear, _convert_ln)
            continue
        _copy_into(replacement, module)
        setattr(model, name, replacement)
    return model


def has_transformer_engine_layers(model) -> bool:
    """Whether `model` holds a TransformerEngine Linear, LayerNorm or TransformerLayer."""
    te = _te("has_transformer_engine_layers")
    kinds = tuple(getattr(te, name) for name in ("Linear", "LayerNorm", "TransformerLayer") if hasattr(te, name))
    return any(isinstance(module, kinds) for module in model.modules())


class _Fp8AutocastForward:
    """`forward` run under TE's `fp8_autocast` while the module it is bound to trains (in eval mode too with
    `use_during_eval`). Called as a method (`MethodType(wrapper, module)`), as Accelerate's wrapper is; a class, not
    a closure, so `__wrapped__` leads back to the forward it wraps."""

    def __init__(self, forward, fp8_recipe, use_during_eval: bool):
        self.__wrapped__ = forward
        self.fp8_recipe = fp8_recipe
        self.use_during_eval = use_during_eval

    def __call__(self, module, *args, **kwargs):
        from transformer_engine.pytorch import fp8_autocast

        with fp8_autocast(enabled=self.use_during_eval or module.training, fp8_recipe=self.fp8_recipe):
            return self.__wrapped__(*args, **kwargs)


def contextual_fp8_autocast(model_forward, fp8_recipe, use_during_eval: bool = False):
    """`model_forward` wrapped to run under `fp8_autocast(fp8_recipe)` while its module trains (evaluation runs in
    higher precision, which gives better metrics, unless `use_during_eval`). Bind the result to the module:
    `model.forward = MethodType(contextual_fp8_autocast(model.forward, recipe), model)`."""
    _te("contextual_fp8_autocast")
    return _Fp8AutocastForward(model_forward, fp8_recipe, use_during_eval)


def recipe_kwargs(handler) -> dict:
    """The `DelayedScaling`/`MXFP8BlockScaling` arguments a `TERecipeKwargs` sets away from TE's defaults."""
    if handler is None:
        return {}
    defaults = {"margin": 0, "interval": 1, "fp8_format": "HYBRID", "amax_history_len": 1024,
                "amax_compute_algo": "most_recent", "override_linear_precision": (False, False, False)}
    return {name: getattr(handler, name) for name, default in defaults.items() if getattr(handler, name) != default}


def build_recipe(handler):
    """TE's recipe object for a `TERecipeKwargs` (or `FP8RecipeKwargs`): MXFP8 block scaling or delayed scaling."""
    _te("apply_fp8_autowrap")
    import transformer_engine.common.recipe as te_recipe

    kwargs = recipe_kwargs(handler)
    if "fp8_format" in kwargs:
        kwargs["fp8_format"] = getattr(te_recipe.Format, kwargs["fp8_format"])
    if handler is not None and handler.use_mxfp8_block_scaling:
        from transformer_engine.pytorch.fp8 import check_mxfp8_support

        available, reason = check_mxfp8_support()
        if not available:
            raise ConfigError(f"use_mxfp8_block_scaling=True: this GPU cannot run MXFP8 ({reason}); fix: turn it off")
        for delayed_only in ("amax_history_len", "amax_compute_algo"):
            kwargs.pop(delayed_only, None)
        return te_recipe.MXFP8BlockScaling(**kwargs)
    return te_recipe.DelayedScaling(**kwargs)


def apply_fp8_autowrap(model, fp8_recipe_handler):
    """Run `model.forward` under TE's `fp8_autocast`, with the recipe a `TERecipeKwargs` describes (None: TE's
    default delayed scaling)."""
    fp8_recipe = build_recipe(fp8_recipe_handler)
    use_during_eval = bool(getattr(fp8_recipe_handler, "use_autocast_during_eval", False))
    model.forward = MethodType(_Fp8AutocastForward(model.forward, fp8_recipe, use_during_eval), model)
    return model


__all__ = ["apply_fp8_autowrap", "contextual_fp8_autocast", "convert_model", "has_transformer_engine_layers"]
