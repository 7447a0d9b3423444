"""fp8 training: which library runs it, whether this machine can, and what `prepare` does to the model.

`mixed_precision="fp8"` keeps the run in bf16 autocast (as Accelerate does) and hands the matmuls of the model's
`nn.Linear` layers to an fp8 library:

- torchao (`AORecipeKwargs`, --fp8_backend ao): the chosen Linear layers become `Float8Linear` at `prepare`;
- TransformerEngine (`TERecipeKwargs`, --fp8_backend te): Linear/LayerNorm layers become TE's, and the prepared
  model's forward runs under `fp8_autocast`.

The library is the recipe handler's, else `--fp8_backend` (HASTEN_/ACCELERATE_FP8_BACKEND), else torchao when
installed, else TransformerEngine. Both need a CUDA GPU with compute capability 8.9 or newer; the Accelerator
checks that when it is built, before any work is done, and says in one line what is missing.
"""

from __future__ import annotations

import os
from weakref import WeakKeyDictionary

import torch

from ...core.errors import ConfigError

CAPABILITY = (8, 9)
_GPUS = "e.g. H100, H200, L4, L40S or RTX 4090"
_LIBRARY = {"AO": ("torchao", 'pip install "hasten[fp8]"'),
            "TE": ("transformer_engine", "pip install transformer_engine[pytorch] (with CUDA)")}
_BACKEND_OWNERS = {"AO": "AORecipeKwargs", "TE": "TERecipeKwargs"}


def support_problem(device_type: str, capability=None, gpu_name: str | None = None, library_missing=None):
    """Why fp8 cannot run here (one line), or None. Pure: the caller measures the device and the library."""
    device_problem = None
    if device_type != "cuda":
        device_problem = (f"this process runs on {device_type!r}, but fp8 training needs a CUDA GPU with compute "
                          f"capability >= {CAPABILITY[0]}.{CAPABILITY[1]} ({_GPUS})")
    elif capability is not None and tuple(capability) < CAPABILITY:
        device_problem = (f"this process's GPU ({gpu_name or 'cuda'}) has compute capability {capability[0]}."
                          f"{capability[1]}, but fp8 training needs >= {CAPABILITY[0]}.{CAPABILITY[1]} ({_GPUS})")
    library_problem = fix = None
    if library_missing is not None:
        library, hint = _LIBRARY[library_missing]
        library_problem, fix = f"{library} is not installed", hint
    if device_problem is None and library_problem is None:
        return None
    problems = "; and ".join(p for p in (device_problem, library_problem) if p)
    fix = "run on such a GPU" + (f" and {fix}" if fix else "") if device_problem else fix
    return f"mixed_precision='fp8': {problems}; fix: {fix}, or use mixed_precision='bf16'"


def library_installed(backend: str) -> bool:
    from ...core import availability

    return availability.is_torchao_available() if backend == "AO" else availability.is_transformer_engine_available()


def check_support(device: torch.device, backend: str) -> None:
    """Raise the one-line ConfigError when this process cannot train in fp8 with `backend` ('AO' or 'TE')."""
    device = torch.device(device)
    capability = name = None
    if device.type == "cuda":
        capability = torch.cuda.get_device_capability(device)
        name = torch.cuda.get_device_name(device)
    problem = support_problem(device.type, capability, name, None if library_installed(backend) else backend)
    if problem is not None:
        raise ConfigError(problem)


def _fp8_rows():
    from ...config import settings

    return [row for row in settings.SETTINGS if row.name.startswith("fp8_") and row.env and row.built]


def _set_rows(rows):
    """The fp8 settings given by a flag, the file or a variable with a value other than the default."""
    from ...config.resolve import runtime_value

    given = []
    for row in rows:
        resolved = runtime_value(row.name)
        if resolved.source != "default" and resolved.value != row.default:
            given.append(resolved)
    return given


def _check_unused(backend: str) -> None:
    """A setting that only the other library reads is refused, never silently dropped."""
    other = {"AO": "TERecipeKwargs", "TE": "AORecipeKwargs"}[backend]
    for resolved in _set_rows([row for row in _fp8_rows() if row.owner == other]):
        raise ConfigError(
            f"{resolved.name} (from {resolved.origin}) is a setting of --fp8_backend {backend_flag(other)}, but this "
            f"run's fp8 backend is {backend_flag(_BACKEND_OWNERS[backend])}; fix: drop it or change the backend"
        )


def backend_flag(owner: str) -> str:
    return {"AORecipeKwargs": "ao", "TERecipeKwargs": "te"}[owner]


def refuse_without_fp8(mixed_precision: str, handler) -> None:
    """fp8 recipe settings with another precision would be ignored: refused instead."""
    if handler is not None:
        raise ConfigError(
            f"{type(handler).__name__} was passed in kwargs_handlers but mixed_precision is {mixed_precision!r}; fix: "
            "Accelerator(mixed_precision='fp8') (or --mixed_precision fp8), or drop the handler"
        )
    if not any(name.startswith(("HASTEN_FP8_", "ACCELERATE_FP8_")) for name in os.environ):
        return
    for resolved in _set_rows(_fp8_rows()):
        raise ConfigError(
            f"{resolved.name} (from {resolved.origin}) only applies to fp8 training, but mixed_precision is "
            f"{mixed_precision!r}; fix: --mixed_precision fp8, or drop the setting"
        )


def recipe_for(mixed_precision: str, device, handler=None, engine: str | None = None):
    """The run's `Fp8Recipe`, or None when it is not an fp8 run (after refusing stray fp8 settings). `engine` is the
    run plan's choice ('AO' or 'TE', `RunPlan.precision.fp8_engine`): nothing here chooses a library."""
    if mixed_precision != "fp8":
        refuse_without_fp8(mixed_precision, handler)
        return None
    if engine not in ("AO", "TE"):
        raise ValueError(f"an fp8 recipe needs the run plan's fp8 engine ('AO' or 'TE'), got {engine!r}")
    backend = engine
    check_support(device, backend)
    _check_unused(backend)
    if handler is None:
        from ...config.fp8 import AORecipeKwargs, TERecipeKwargs

        handler = AORecipeKwargs() if backend == "AO" else TERecipeKwargs()
    return Fp8Recipe(backend, handler)


class Fp8Recipe:
    """The fp8 part of a run's precision: converts models at `prepare` and re-points optimizers built before."""

    def __init__(self, backend: str, handler):
        self.backend = backend  # "AO" or "TE"
        self.handler = handler
        self._converted = WeakKeyDictionary()  # model -> True
        # id(parameter before conversion) -> (that parameter, the one after); holding the old one keeps its id unique
        self._replacement = {}

    def convert(self, models, optimizers=(), fsdp2: bool = False) -> None:
        """Swap the layers of each model not converted yet, and point `optimizers` at the new parameters."""
        for model in models:
            if model in self._converted or getattr(model, "_is_accelerate_prepared", False):
                continue
            if self._already_fp8(model):  # the user converted it before prepare: nothing to swap twice
                self._converted[model] = True
                continue
            before = dict(model.named_parameters())
            if self.backend == "AO":
                _convert_ao(model, self.handler, fsdp2)
            else:
                from .te import convert_model

                with torch.no_grad():
                    convert_model(model)
            after = dict(model.named_parameters())
            for name, old in before.items():
                new = after.get(name)
                if new is not None and new is not old:
                    self._replacement[id(old)] = (old, new)
            self._converted[model] = True
            if self.backend == "AO" and fsdp2 and _all_gather_on(self.handler):
                for optimizer in optimizers:
                    _precompute_scales_after_step(getattr(optimizer, "optimizer", optimizer), model)
        for optimizer in optimizers:
            self.repoint(optimizer)

    def _already_fp8(self, model) -> bool:
        if self.backend == "AO":
            from .ao import has_ao_layers

            return has_ao_layers(model)
        from .te import has_transformer_engine_layers

        return has_transformer_engine_layers(model)

    def repoint(self, optimizer) -> None:
        """Make an optimizer built on the unconverted model update the converted layers' parameters."""
        if not self._replacement:
            return
        optimizer = getattr(optimizer, "optimizer", optimizer)
        for group in optimizer.param_groups:
            group["params"] = [self._replacement.get(id(p), (p, p))[1] for p in group["params"]]
        for old, new in self._replacement.values():
            if old in optimizer.state:
                optimizer.state[new] = optimizer.state.pop(old)

    def wrap_prepared(self, model):
        """TransformerEngine: the prepared (outermost) model's forward runs under `fp8_autocast`."""
        if self.backend != "TE" or getattr(model, "_hasten_fp8_autocast", False):
            return model
        from .te import apply_fp8_autowrap

        apply_fp8_autowrap(model, self.handler)
        model._hasten_fp8_autocast = True
        return model


def _all_gather_on(handler) -> bool:
    return bool(getattr(handler.config, "enable_fsdp_float8_all_gather", False))


def _convert_ao(model, handler, fsdp2: bool) -> None:
    from dataclasses import replace

    from .ao import convert_model_to_fp8_ao

    config = handler.config
    if config is not None and config.enable_fsdp_float8_all_gather and not fsdp2:
        # The float8 all-gather is FSDP2's; elsewhere it only swaps the weights for new parameter objects.
        config = replace(config, enable_fsdp_float8_all_gather=False)
    convert_model_to_fp8_ao(model, config=config, module_filter_func=handler.module_filter_func)


def _precompute_scales_after_step(optimizer, model) -> None:
    """FSDP2 with float8 all-gather: compute every float8 weight's scale in one all-reduce after each step."""
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    optimizer.register_step_post_hook(lambda *_args, **_kwargs: precompute_float8_dynamic_scale_for_fsdp(model))


__all__ = ["Fp8Recipe", "check_support", "recipe_for", "support_problem"]
