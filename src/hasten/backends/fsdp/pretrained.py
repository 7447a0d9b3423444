"""`save_pretrained` of a model that FSDP2 sharded: whole weights, not shards.

`fully_shard` turns every parameter into a DTensor that holds this process's shard, and a model's own `state_dict()`
then returns those DTensors. transformers' `save_pretrained` gathers them only for the models it sharded itself
(`config.distributed_config`); for a model sharded by `prepare` it handed the DTensors to safetensors, whose
`storage_ptr` fails on a tensor subclass without storage ("Attempted to access the data pointer on an invalid python
storage"), and Accelerate's own example (`nd_parallel.py`) crashed at its last line. No storage was freed: the
wrapper of a DTensor has none to give.

So `prepare` gives a sharded transformers model's `save_pretrained` the whole state dict when the caller passes
none: every process gathers (a collective: call it on every process, as the example does); the main process gets
the whole tensors in CPU memory and writes them; the others pass `{}` and `is_main_process=False`, so they write
nothing (their DTensors were no better: transformers' tied-weight check sliced them, a collective that only they
joined, and hung).
"""

from __future__ import annotations

import functools
import inspect
import weakref

_MARK = "_hasten_whole_weights"


def _is_transformers_model(model) -> bool:
    return any(cls.__name__ == "PreTrainedModel" and cls.__module__.startswith("transformers.")
               for cls in type(model).__mro__)


def save_pretrained_with_whole_weights(model) -> None:
    """Make a transformers model's `model.save_pretrained(...)` save the gathered whole weights when the caller gives
    no `state_dict`. Once per model; the model's class is left alone."""
    save = getattr(model, "save_pretrained", None)
    if not _is_transformers_model(model) or not callable(save) or getattr(save, _MARK, False):
        return
    signature = inspect.signature(save)
    if not {"state_dict", "is_main_process"} <= set(signature.parameters):
        return
    unbound = type(model).save_pretrained  # the class's function: the model holds this wrapper, which holds the
    owner = weakref.ref(model)  # model only weakly (no reference cycle keeps a freed model alive)

    @functools.wraps(unbound)
    def save_pretrained(*args, **kwargs):
        model = owner()
        bound = signature.bind(*args, **kwargs)
        if bound.arguments.get("state_dict") is None:
            import torch.distributed as dist

            from .checkpoint import full_model_state_dict

            bound.arguments["state_dict"] = full_model_state_dict(model)  # a collective; {} but on rank 0
            if dist.get_rank() != 0:
                bound.arguments["is_main_process"] = False
        return unbound(model, *bound.args, **bound.kwargs)

    setattr(save_pretrained, _MARK, True)
    model.save_pretrained = save_pretrained
