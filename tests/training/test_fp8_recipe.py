"""The recipe fields of `FP8RecipeKwargs` (Accelerate's older spelling) and `TERecipeKwargs` reach the
TransformerEngine recipe object hasten builds (`training/fp8/te.py: build_recipe`, `apply_fp8_autowrap`).

TransformerEngine needs CUDA and is not installed on CI: a stand-in `transformer_engine` records what hasten
hands it. The MS-AMP spellings (`opt_level`) are refused in one line."""

from __future__ import annotations

import enum
import sys
import types
import warnings

import pytest
import torch

from hasten.config.fp8 import FP8RecipeKwargs, MSAMPRecipeKwargs, TERecipeKwargs
from hasten.core.errors import NotBuiltError


class _Recipe:
    def __init__(self, **kwargs):
        self.kwargs = kwargs


@pytest.fixture
def te(monkeypatch):
    """A stand-in TransformerEngine: its recipe classes record their arguments."""
    for name in list(__import__("os").environ):
        if name.startswith(("ACCELERATE_FP8_", "HASTEN_FP8_", "ACCELERATE_MIXED_PRECISION", "HASTEN_MIXED")):
            monkeypatch.delenv(name)
    recipe = types.ModuleType("transformer_engine.common.recipe")
    recipe.Format = enum.Enum("Format", "HYBRID E4M3 E5M2")
    recipe.DelayedScaling = type("DelayedScaling", (_Recipe,), {})
    recipe.MXFP8BlockScaling = type("MXFP8BlockScaling", (_Recipe,), {})
    fp8 = types.ModuleType("transformer_engine.pytorch.fp8")
    fp8.check_mxfp8_support = lambda: (True, "")
    pytorch = types.ModuleType("transformer_engine.pytorch")
    pytorch.fp8 = fp8
    root = types.ModuleType("transformer_engine")
    root.pytorch, root.common = pytorch, types.ModuleType("transformer_engine.common")
    root.common.recipe = recipe
    for name, module in (("transformer_engine", root), ("transformer_engine.pytorch", pytorch),
                         ("transformer_engine.pytorch.fp8", fp8), ("transformer_engine.common", root.common),
                         ("transformer_engine.common.recipe", recipe)):
        monkeypatch.setitem(sys.modules, name, module)
    import hasten.training.fp8.te as te_module

    monkeypatch.setattr(te_module, "is_transformer_engine_available", lambda: True)
    return recipe


def _older(**kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return FP8RecipeKwargs(**kwargs)


@pytest.mark.parametrize("cls", [FP8RecipeKwargs, TERecipeKwargs])
def test_delayed_scaling_fields_reach_the_recipe(te, cls):
    from hasten.training.fp8.te import build_recipe

    make = _older if cls is FP8RecipeKwargs else cls
    handler = make(margin=2, interval=3, fp8_format="E4M3", amax_history_len=16, amax_compute_algo="max",
                   override_linear_precision=(True, False, True))
    recipe = build_recipe(handler)
    assert type(recipe).__name__ == "DelayedScaling"
    assert recipe.kwargs == {"margin": 2, "interval": 3, "fp8_format": te.Format.E4M3, "amax_history_len": 16,
                             "amax_compute_algo": "max", "override_linear_precision": (True, False, True)}
    assert build_recipe(make()).kwargs == {}  # TE's own defaults


@pytest.mark.parametrize("cls", [FP8RecipeKwargs, TERecipeKwargs])
def test_use_mxfp8_block_scaling_builds_the_block_scaling_recipe(te, cls):
    from hasten.training.fp8.te import build_recipe

    make = _older if cls is FP8RecipeKwargs else cls
    recipe = build_recipe(make(use_mxfp8_block_scaling=True, fp8_format="E4M3", margin=1))
    assert type(recipe).__name__ == "MXFP8BlockScaling"
    assert recipe.kwargs == {"fp8_format": te.Format.E4M3, "margin": 1}


@pytest.mark.parametrize("cls", [FP8RecipeKwargs, TERecipeKwargs])
def test_use_autocast_during_eval_reaches_the_forward_wrapper(te, cls):
    from hasten.training.fp8.te import apply_fp8_autowrap

    make = _older if cls is FP8RecipeKwargs else cls
    model = torch.nn.Linear(2, 2)
    apply_fp8_autowrap(model, make(use_autocast_during_eval=True))
    assert model.forward.__func__.use_during_eval is True
    model = torch.nn.Linear(2, 2)
    apply_fp8_autowrap(model, make())
    assert model.forward.__func__.use_during_eval is False


def test_override_dgrad_and_mxfp8_variables_reach_the_recipe(te, monkeypatch):
    """Rows fp8_override_dgrad (ACCELERATE_FP8_OVERRIDE_DGRAD) and fp8_use_mxfp8_block_scaling
    (ACCELERATE_FP8_USE_MXFP8_BLOCK_SCALING): the launcher's variables become the recipe."""
    from hasten.training.fp8.te import build_recipe

    monkeypatch.setenv("ACCELERATE_FP8_OVERRIDE_DGRAD", "true")
    assert build_recipe(TERecipeKwargs()).kwargs == {"override_linear_precision": (False, True, False)}
    monkeypatch.setenv("ACCELERATE_FP8_USE_MXFP8_BLOCK_SCALING", "true")
    assert type(build_recipe(TERecipeKwargs())).__name__ == "MXFP8BlockScaling"


def test_opt_level_is_refused_in_one_line():
    """FP8RecipeKwargs(opt_level=) and MSAMPRecipeKwargs(opt_level=) are MS-AMP's, which hasten does not build."""
    for make, given in ((lambda: _older(opt_level="O1"), "FP8RecipeKwargs"),
                        (lambda: MSAMPRecipeKwargs(opt_level="O2"), "MSAMPRecipeKwargs(opt_level='O2')")):
        with pytest.raises(NotBuiltError, match="MS-AMP") as caught:
            make()
        assert "\n" not in str(caught.value) and str(caught.value).startswith(given)
