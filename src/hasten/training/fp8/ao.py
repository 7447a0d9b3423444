"""torchao float8 training: which `nn.Linear` layers become `Float8Linear`, and the swap itself.

Accelerate's paths: `hasten.utils.ao` re-exports these. The layer choice is plain module-tree logic and runs
anywhere; the swap needs torchao (`pip install "hasten[fp8]"`), and fp8 matmuls need a CUDA GPU with compute
capability 8.9 or newer.
"""

from __future__ import annotations

import functools
from typing import Callable, Optional

import torch

from ...core.availability import is_torchao_available

INSTALL_HINT = 'pip install "hasten[fp8]"'


def _require_torchao(what: str) -> None:
    if not is_torchao_available():
        raise ImportError(f"{what} needs torchao >= 0.6.1, which is not installed; fix: {INSTALL_HINT}")


def find_first_last_linear_layers(model: torch.nn.Module):
    """The names of the first and of the last `nn.Linear` in `model` (in `named_modules` order); None if none."""
    names = [name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)]
    return (names[0], names[-1]) if names else (None, None)


def filter_linear_layers(module, fqn: str, layers_to_filter) -> bool:
    """True when `module` may become float8: not named in `layers_to_filter`, and, for an `nn.Linear`, both of
    its dimensions divisible by 16 (the fp8 matmul's requirement)."""
    if isinstance(module, torch.nn.Linear) and (module.in_features % 16 or module.out_features % 16):
        return False
    return fqn not in layers_to_filter


def filter_first_and_last_linear_layers(module, fqn: str) -> bool:
    """The default filter: keep the first and last `nn.Linear` layers in high precision (training is unstable
    otherwise) and skip layers whose dimensions do not divide by 16.

    torchao calls a filter with each layer, which cannot see where the layer sits in the model: passed as
    `module_filter_func` (to `convert_model_to_fp8_ao` or `AORecipeKwargs`), hasten binds it to the model being
    converted. Called on its own with a whole model, it answers for that model's own first/last layers.
    """
    first, last = find_first_last_linear_layers(module)
    return filter_linear_layers(module, fqn, layers_to_filter=[first, last])


def default_filter_for(model: torch.nn.Module) -> Callable:
    """`filter_first_and_last_linear_layers` bound to `model`: its first and last Linear layers stay as they are."""
    first, last = find_first_last_linear_layers(model)
    return functools.partial(filter_linear_layers, layers_to_filter=[first, last])


def layers_to_convert(model: torch.nn.Module, module_filter_func: Optional[Callable] = None) -> list:
    """The names of the `nn.Linear` layers `convert_model_to_fp8_ao` would swap (without torchao)."""
    chosen = _bound_filter(model, module_filter_func)
    return [name for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear) and name and chosen(module, name)]


def _bound_filter(model, module_filter_func):
    if module_filter_func is None or module_filter_func is filter_first_and_last_linear_layers:
        return default_filter_for(model)
    return module_filter_func


def has_ao_layers(model: torch.nn.Module) -> bool:
    """Whether `model` holds a torchao `Float8Linear` layer."""
    _require_torchao("has_ao_layers")
    from torchao.float8.float8_linear import Float8Linear

    return any(isinstance(module, Float8Linear) for module in model.modules())


def convert_model_to_fp8_ao(model: torch.nn.Module, config=None, module_filter_func: Optional[Callable] = None):
    """Swap, in place, the chosen `nn.Linear` layers of `model` for torchao `Float8Linear` (same parameters, fp8
    matmuls). `config` is a `torchao.float8.Float8LinearConfig` (None: torchao's default); `module_filter_func(module,
    fqn) -> bool` chooses the layers (default: `filter_first_and_last_linear_layers`, bound to `model`).

    With `config.enable_fsdp_float8_all_gather` the converted weights become new parameter objects: an optimizer
    built before must be pointed at them (`Accelerator.prepare` does it).
    """
    _require_torchao("convert_model_to_fp8_ao")
    from torchao.float8 import convert_to_float8_training

    convert_to_float8_training(model, module_filter_fn=_bound_filter(model, module_filter_func), config=config)
    return model


__all__ = [
    "convert_model_to_fp8_ao", "filter_first_and_last_linear_layers", "filter_linear_layers",
    "find_first_last_linear_layers", "has_ao_layers",
]
