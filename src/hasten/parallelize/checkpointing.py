"""Layout step: activation checkpointing. Each chosen block recomputes its activations in backward instead of keeping
them. Three ways, each where the engine around it wants it:

- `checkpoint_wrap_blocks`: torch's `CheckpointWrapper` around each block (Accelerate's FSDP2 way, before
  `fully_shard`; parameter names gain `_checkpoint_wrapped_module.`), optionally with CPU offload of what it saves;
- `checkpoint_blocks`: torch's composable `checkpoint` on each block in place (names unchanged): tensor-parallel
  layouts that shard no data dimension, and pipeline stages;
- `wrap_blocks_for_fsdp1`: torch's `apply_activation_checkpointing` (non-reentrant), before FSDP1 wraps the model.
"""

from __future__ import annotations

import functools

import torch

from ..core.errors import ConfigError

_NEEDS_POLICY = ("fsdp activation_checkpointing needs an auto_wrap_policy (TRANSFORMER_BASED_WRAP or SIZE_BASED_WRAP) "
                 "to know which blocks to recompute")


def blocks_of(model, predicate) -> list:
    """The submodules `predicate` (the plugin's wrap policy) picks, `model` itself excluded; one line without one."""
    if predicate is None:
        raise ConfigError(_NEEDS_POLICY)
    return [m for m in model.modules() if m is not model and predicate(m)]


def checkpoint_blocks(blocks) -> None:
    """Composable checkpointing of each block, in place: parameter names (and checkpoints) stay the same."""
    from torch.distributed._composable import checkpoint

    for block in blocks:
        checkpoint(block)


def wrap_blocks_for_fsdp1(model, predicate) -> None:
    """FSDP1's activation checkpointing: each picked block inside a non-reentrant `CheckpointWrapper`."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        apply_activation_checkpointing,
        checkpoint_wrapper,
    )

    chosen = {id(b) for b in blocks_of(model, predicate)}
    apply_activation_checkpointing(
        model, checkpoint_wrapper_fn=functools.partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT),
        check_fn=lambda m: id(m) in chosen,
    )


def checkpoint_wrap_blocks(model, predicate, offload: bool = False) -> torch.nn.Module:
    """Accelerate's activation checkpointing for FSDP2: each submodule `predicate` picks (the plugin's auto-wrap
    policy) is replaced, in `model`, by torch's `CheckpointWrapper` around it, innermost first, so parameter
    names gain `_checkpoint_wrapped_module.` (state_dict keys do not). A block wrapped already is left as it is.
    Unlike Accelerate, the random state is preserved for the recomputation: dropout inside a block then draws the
    same mask in backward as in forward, so the gradient is that of the forward that ran.

    `offload` (the plugin's activation_checkpointing_offload): each wrapped block also inside torch's
    `offload_wrapper`, which keeps what the checkpoint saves (the block's input) in CPU memory until backward, as
    Accelerate does; on a CPU run that is a copy in CPU memory, so it changes nothing but costs a copy."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointWrapper,
        checkpoint_wrapper,
        offload_wrapper,
    )

    from ..training.compilation import get_module_children_bottom_up

    if predicate is None:
        raise ConfigError(_NEEDS_POLICY)
    inside_wrapper = {id(m._checkpoint_wrapped_module) for m in model.modules() if isinstance(m, CheckpointWrapper)}
    for name, block in get_module_children_bottom_up(model, return_fqns=True)[:-1]:
        if isinstance(block, CheckpointWrapper) or id(block) in inside_wrapper or not predicate(block):
            continue
        wrapped = checkpoint_wrapper(block)
        model.set_submodule(name, offload_wrapper(wrapped) if offload else wrapped)
        inside_wrapper.add(id(block))
    return model
