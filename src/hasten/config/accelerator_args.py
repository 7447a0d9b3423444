"""What `Accelerator(...)` is given, checked and sorted before anything is built: kwargs handlers, the FSDP and
DeepSpeed plugins, and gradient accumulation. Kept out of the facade so that `accelerator.py` only delegates."""

from __future__ import annotations

from ..core.errors import ConfigError, NotSupportedYetError
from .handlers import (
    AutocastKwargs,
    DistributedDataParallelKwargs,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    KwargsHandler,
    ProfileKwargs,
)
from .fp8 import RECIPE_HANDLERS, AORecipeKwargs, FP8RecipeKwargs, MSAMPRecipeKwargs, TERecipeKwargs
from .resolve import runtime_value

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


def deepspeed_plugins(deepspeed_plugin, deepspeed_plugins, fsdp_plugin):
    """The DeepSpeed plugin(s) of the run, or None when DeepSpeed is not asked for (in code or by the launcher)."""
    if deepspeed_plugin is None and deepspeed_plugins is None and not runtime_value("use_deepspeed").value:
        return None
    from ..backends.deepspeed.plugin import DeepSpeedPlugin, plugins_from, refuse_plugins_for_a_second_accelerator

    if deepspeed_plugin is None and deepspeed_plugins is None:
        deepspeed_plugin = DeepSpeedPlugin()
    else:
        refuse_plugins_for_a_second_accelerator()
    if fsdp_plugin is not None:
        raise ConfigError("DeepSpeed and FSDP cannot be combined: pass one of deepspeed_plugin and fsdp_plugin")
    plugins = plugins_from(deepspeed_plugin, deepspeed_plugins)
    from ..utils.imports import is_deepspeed_available

    if not is_deepspeed_available():
        raise ImportError('DeepSpeed is not installed: pip install "hasten[deepspeed]"')
    return plugins


def fsdp_plugin(plugin):
    """The FSDP plugin of the run when FSDP is asked for (in code or by the launcher): the given one or a default."""
    if plugin is None and not runtime_value("use_fsdp").value:
        return None
    try:
        from ..backends.fsdp.plugin import FullyShardedDataParallelPlugin
    except ImportError:
        raise NotSupportedYetError("FSDP is not supported by this version of hasten yet") from None
    if plugin is None:
        return FullyShardedDataParallelPlugin()
    if not isinstance(plugin, FullyShardedDataParallelPlugin):
        raise TypeError(f"fsdp_plugin must be a FullyShardedDataParallelPlugin, got {type(plugin).__name__}")
    return plugin


def accumulation_plugin(steps_argument: int, plugin: GradientAccumulationPlugin | None, backend):
    """The run's GradientAccumulationPlugin. The launcher's value replaces the argument, as in Accelerate (the
    settings table's precedence says so); the backend may adjust the count (DeepSpeed's config owns it)."""
    steps = runtime_value("gradient_accumulation_steps", steps_argument)
    if steps.source == "environment":
        source = f"environment variable {steps.origin}"
    else:
        source = "Accelerator(gradient_accumulation_steps=...)" if steps.value != 1 else "default"
    if plugin is not None:
        if steps.value != 1:
            raise ConfigError(
                "pass either gradient_accumulation_steps or gradient_accumulation_plugin, not both "
                "(set GradientAccumulationPlugin(num_steps=...) instead)"
            )
    else:
        if not isinstance(steps.value, int) or steps.value < 1:
            raise ConfigError(f"gradient_accumulation_steps must be a positive integer, got {steps.value!r}")
        plugin = GradientAccumulationPlugin(num_steps=steps.value)
    if plugin.num_steps is not None:
        if plugin.num_steps != 1 and source == "default":
            source = "GradientAccumulationPlugin(num_steps=...)"
        plugin.num_steps = backend.accumulation_steps(plugin.num_steps, source)
    return plugin
