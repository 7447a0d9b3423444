"""The precision rules of the plan: which fp8 engine an fp8 run trains with."""

from __future__ import annotations


def fp8_engine(handler=None) -> str:
    """'AO' (torchao) or 'TE' (Transformer Engine): the recipe handler's library, else the fp8_backend setting, else
    the installed one (torchao first)."""
    from ..config.fp8 import AORecipeKwargs
    from ..config.resolve import runtime_value
    from ..core.availability import is_torchao_available, is_transformer_engine_available

    if handler is not None:
        return "AO" if isinstance(handler, AORecipeKwargs) else "TE"
    chosen = runtime_value("fp8_backend").value  # msamp is refused there, in one line
    if chosen:
        return chosen.upper()
    if not is_torchao_available() and is_transformer_engine_available():
        return "TE"
    return "AO"
