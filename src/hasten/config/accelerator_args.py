"""The kwargs handlers `Accelerator(kwargs_handlers=[...])` is given, checked and sorted into their slots. (The
plugins and gradient accumulation are the run plan's: hasten.plan.)"""

from __future__ import annotations

from ..core.errors import ConfigError
from .handlers import (
    AutocastKwargs,
    DistributedDataParallelKwargs,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    KwargsHandler,
    ProfileKwargs,
)
from .fp8 import RECIPE_HANDLERS, AORecipeKwargs, FP8RecipeKwargs, MSAMPRecipeKwargs, TERecipeKwargs

# kwargs handler class -> attribute of the Accelerator that holds it
HANDLER_SLOTS = {
    DistributedDataParallelKwargs: "ddp_handler",
    GradScalerKwargs: "scaler_handler",
    InitProcessGroupKwargs: "init_handler",
    AutocastKwargs: "autocast_handler",
    ProfileKwargs: "profile_handler",
    AORecipeKwargs: "ao_recipe_handler",
    TERecipeKwargs: "te_recipe_handler",
    MSAMPRecipeKwargs: "msamp_recipe_handler",
    FP8RecipeKwargs: "fp8_recipe_handler",
}


def sort_handlers(handlers) -> tuple[dict, object]:
    """{attribute: handler or None} for every slot, and the one fp8 recipe handler (or None)."""
    slots = dict.fromkeys(HANDLER_SLOTS.values())
    for handler in handlers:
        if not isinstance(handler, KwargsHandler):
            raise ConfigError(f"kwargs_handlers takes KwargsHandler objects; got {type(handler).__name__}")
        slot = HANDLER_SLOTS.get(type(handler))
        if slot is None:
            raise ConfigError(
                f"{type(handler).__name__} is not a kwargs handler Accelerator(kwargs_handlers=...) accepts; "
                f"accepted: {', '.join(c.__name__ for c in HANDLER_SLOTS)}"
            )
        if slots[slot] is not None:
            raise ConfigError(f"only one {type(handler).__name__} may be passed in kwargs_handlers")
        slots[slot] = handler
    recipes = [h for h in handlers if isinstance(h, RECIPE_HANDLERS)]
    if len(recipes) > 1:
        raise ConfigError(f"pass one fp8 recipe handler, not {' and '.join(type(h).__name__ for h in recipes)}")
    return slots, (recipes[0] if recipes else None)
