"""The steps of sharding one model with FSDP2, shared by the FSDP backend and Accelerate's `fsdp_utils` helpers
(`functions`): `fully_shard`'s keywords, fp32 master weights under mixed precision, sharding the units a wrap policy
picks, activation checkpointing around blocks, filling a sharded model from rank 0's weights.

`functions` (Accelerate's `utils.fsdp_utils`) hands the backend its own wrap policy and upcast, looked up when called,
so a script's `mock.patch` of them reaches the run; this module takes them as arguments and looks nothing up.
"""

from __future__ import annotations

import logging

import torch
import torch.distributed as dist

from ..core.errors import ConfigError


_CHECKPOINT_PART = "_checkpoint_wrapped_module."


def state_name(name: str) -> str:
    """A parameter's state-dict name: without the `_checkpoint_wrapped_module.` that torch's CheckpointWrapper
    inserts into `named_parameters` (its state_dict hooks, and torch.distributed.checkpoint, drop it)."""
    return name.replace(_CHECKPOINT_PART, "")


def plain_named_parameters(model) -> dict:
    """`dict(model.named_parameters())` under state-dict names, the same with or without activation checkpointing."""
    return {state_name(name): param for name, param in model.named_parameters()}


def named_tensors(model) -> dict:
    """Every parameter and buffer by its state-dict name (the tensors themselves, not copies)."""
    tensors = plain_named_parameters(model)
    tensors.update((state_name(name), buffer) for name, buffer in model.named_buffers())
    return tensors


def plain_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The plain tensor that holds `tensor`'s values: itself, or the one inside a wrapper subclass (torchao's fp8
    weight, `WeightWithDynamicFloat8CastTensor`). Moving a model to the meta device swaps a wrapper's contents in
    place, so a wrapper kept as rank 0's source of weights would be empty by the time they are streamed."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    while is_traceable_wrapper_subclass(tensor):
        inner, _ = tensor.__tensor_flatten__()
        if len(inner) != 1:
            break
        tensor = getattr(tensor, inner[0])
    return tensor


def shared_parameters(model) -> list:
    """Each parameter held in more than one place (tied weights: an embedding and an output head), as its
    `(module, attribute)` places in `model.modules()` order, the place FSDP2 tracks first."""
    places = {}
    for module in model.modules():
        for attr, param in module._parameters.items():
            if param is not None:
                places.setdefault(id(param), []).append((module, attr))
    return [group for group in places.values() if len(group) > 1]


def retie(groups: list) -> None:
    """Make every place of each group (`shared_parameters`) hold its first place's parameter again. Materialising
    a sharded meta model (`to_empty`) gives each module its own new tensor, which cuts a tie: the second place was
    left uninitialised, rank 0's weights never reached it (it has no name of its own in a state dict), and it stayed
    so until FSDP2's first forward re-pointed it (a checkpoint or an optimizer made before then saw the garbage)."""
    for (owner, attr), *aliases in groups:
        param = owner._parameters[attr]
        for module, name in aliases:
            module._parameters[name] = param


def shard_kwargs(plugin, mesh, offload_policy=None) -> dict:
    """`fully_shard`'s keywords from the plugin (torch's defaults where it holds none); `offload_policy` in place
    of the plugin's `cpu_offload` (the backend leaves the offload out on a CPU run)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, OffloadPolicy

    return dict(mesh=mesh, reshard_after_forward=plugin.reshard_after_forward,
                mp_policy=plugin.mixed_precision_policy or MixedPrecisionPolicy(),
                offload_policy=offload_policy or plugin.cpu_offload or OffloadPolicy())


def upcast_for_fsdp2(model: torch.nn.Module, mixed_precision: str, is_main_process: bool = True,
                     log: logging.Logger | None = None) -> None:
    """As Accelerate: under mixed precision, trainable parameters are kept in fp32 (master weights; the policy's
    param_dtype is what computes), which also gives FSDP2 the one dtype per unit it needs (transformers keeps
    norms in fp32 beside bf16 weights). Not for 4-bit quantized models, whose weights a cast would destroy."""
    if str(mixed_precision) == "no" or any(type(p).__name__ == "Params4bit" for p in model.parameters()):
        return
    upcast = [name for name, p in model.named_parameters() if p.requires_grad and p.dtype != torch.float32]
    for name in upcast:
        parameter = model.get_parameter(name)
        parameter.data = parameter.data.to(torch.float32)
    if upcast and is_main_process:
        (log or logging.getLogger("hasten.utils.fsdp_utils")).info(
            "FSDP upcast of low precision parameters to fp32 (since mixed_precision != 'no') may affect the precision "
            f"of model checkpoints. This effects {len(upcast)} parameters: {upcast}...")


def shard_units(model: torch.nn.Module, fsdp_kwargs: dict, wants_own_unit, can_be_unit=None, after_unit=None) -> None:
    """`fully_shard` each submodule `wants_own_unit` picks (innermost first: a block's parameters belong to the
    innermost unit that claims them; None: none), then the root. `after_unit(module, its parameters before)`."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    def shard(module):
        replaced = list(module.parameters())
        fully_shard(module, **fsdp_kwargs)
        if after_unit is not None:
            after_unit(module, replaced)

    if wants_own_unit is not None:
        for module in reversed(list(model.modules())):
            if module is model or isinstance(module, FSDPModule) or (can_be_unit and not can_be_unit(module)):
                continue
            if wants_own_unit(module):
                shard(module)
    shard(model)


def materialize(model, device, offload: bool) -> None:
    """Give a sharded meta model real (uninitialised) storage: parameters where FSDP2 keeps them between uses
    (CPU memory under CPUOffloadPolicy, else the device), buffers on the device (the forward pass reads them
    there). Materialising everything on the device put the offloaded shards on the GPU."""
    model.to_empty(device="cpu" if offload else device)
    if offload and torch.device(device).type != "cpu":
        for module in model.modules():
            for name, buffer in module._buffers.items():
                if buffer is not None:
                    module._buffers[name] = buffer.to(device)


def load_full_state_dict(model, full_state: dict, device, cpu_offload: bool = False) -> None:
    """Fill an FSDP2-sharded model (on the meta device or not) from a whole state dict that rank 0 holds; the
    other ranks may pass `{}`. Each tensor is broadcast from rank 0 and every process keeps only its shard.
    The caller's dict is read, never changed. Non-persistent buffers are in no state dict: fill them yourself.
    """
    from .streaming import stream_from_rank0

    if any(t.is_meta for t in named_tensors(model).values()):
        ties = shared_parameters(model)
        materialize(model, device, offload=cpu_offload)
        retie(ties)
    stream_from_rank0(named_tensors(model), dict(full_state) if dist.get_rank() == 0 else {}, torch.device(device))
    if cpu_offload:
        # FSDP2's CPUOffloadPolicy expects the sharded parameters in CPU memory between uses.
        for param in model.parameters():
            if param.device.type != "cpu":
                param.data = param.data.cpu()
    if hasattr(model, "tie_weights"):  # transformers models: materialising broke the embedding/head tie
        model.tie_weights()


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
        raise ConfigError(
            "fsdp activation_checkpointing needs an auto_wrap_policy (TRANSFORMER_BASED_WRAP or SIZE_BASED_WRAP) to "
            "know which blocks to recompute"
        )
    inside_wrapper = {id(m._checkpoint_wrapped_module) for m in model.modules() if isinstance(m, CheckpointWrapper)}
    for name, block in get_module_children_bottom_up(model, return_fqns=True)[:-1]:
        if isinstance(block, CheckpointWrapper) or id(block) in inside_wrapper or not predicate(block):
            continue
        wrapped = checkpoint_wrapper(block)
        model.set_submodule(name, offload_wrapper(wrapped) if offload else wrapped)
        inside_wrapper.add(id(block))
    return model

