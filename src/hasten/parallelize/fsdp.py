"""Layout step: FSDP2 over the data-parallel dimensions (`apply_fsdp`; a pipeline's stages: `shard_stages`), and the
pieces of sharding one model that the FSDP backend and Accelerate's `fsdp_utils` helpers (`backends/fsdp/functions`)
share: `fully_shard`'s keywords, fp32 master weights under mixed precision, sharding the units a wrap policy picks,
filling a sharded model from rank 0's weights.

`functions` (Accelerate's `utils.fsdp_utils`) hands its own wrap policy and upcast, looked up when called, so a
script's `mock.patch` of them reaches the run; this module takes them as arguments and looks nothing up.
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


# -- the step ----------------------------------------------------------------------------------------------------------

def ignored_modules(model, ignored) -> list:
    """The plugin's `ignored_modules` as modules: given as modules, or as a regex every full name must match."""
    if ignored is None:
        return []
    if isinstance(ignored, str):
        import re

        pattern = re.compile(ignored)
        return [module for name, module in model.named_modules() if pattern.fullmatch(name)]
    return list(ignored)


def refuse_meta(model, plugin, fsdp2: bool) -> None:
    """One line, on every rank together, for a model on the meta device that sharding cannot fill."""
    from ..distributed.control import any_rank

    ram_efficient = plugin.cpu_ram_efficient_loading
    if fsdp2 and not ram_efficient and any_rank(any(p.is_meta for p in model.parameters())):
        raise ConfigError(
            "prepare() got a model with parameters on the meta device; load its weights first, or build it on the "
            "meta device on every process but rank 0 and set fsdp cpu_ram_efficient_loading=True"
        )
    if ram_efficient and any_rank(dist.get_rank() == 0 and any(p.is_meta for p in model.parameters())):
        raise ConfigError(
            "fsdp cpu_ram_efficient_loading: rank 0 must build the model with its real weights (the others may use "
            "the meta device), but rank 0's model has parameters on the meta device"
        )


def apply_fsdp(model, plugin, mesh, *, device, precision_mode: str, offload_policy, offloads: bool,
               wrap_policy=None, upcast=None) -> list:
    """`fully_shard` `model` in place over `mesh`, as Accelerate's `fsdp2_prepare_model` does: fp32 master weights
    under mixed precision (`upcast`), activation checkpointing around the wrap policy's blocks, each unit the policy
    picks then the root, and with cpu_ram_efficient_loading rank 0's weights streamed into everyone's empty shards.
    `offload_policy`/`offloads`: what the caller decided about CPU offload (left out on a CPU run). `wrap_policy`
    `(plugin, model)` and `upcast` are Accelerate's patchable helpers when its `fsdp2_prepare_model` called.
    Returns [(parameter before, parameter after)] for the optimizer to be re-pointed."""
    from .checkpointing import checkpoint_wrap_blocks

    ram_efficient = plugin.cpu_ram_efficient_loading
    (upcast or upcast_for_fsdp2)(model, precision_mode, dist.get_rank() == 0)
    old_params = plain_named_parameters(model)
    if ram_efficient:
        # Everyone shards an empty (meta) model; rank 0 then streams its weights in tensor by tensor. fp8 layers
        # (torchao) were swapped in before, on rank 0's real weights and the others' meta ones alike: rank 0 keeps
        # the plain tensors inside their fp8 wrappers, which the move to meta would empty.
        full = {}
        if dist.get_rank() == 0:
            full = {name: plain_tensor(t) for name, t in named_tensors(model).items()}
        ties = shared_parameters(model)
        model.to("meta")
    if plugin.activation_checkpointing:
        # As Accelerate's prepare (fsdp2_apply_ac): each block inside torch's CheckpointWrapper, before sharding.
        checkpoint_wrap_blocks(model, plugin.wrap_predicate(model), offload=plugin.activation_checkpointing_offload)
    kwargs = shard_kwargs(plugin, mesh, offload_policy=offload_policy)
    ignored = {p for module in ignored_modules(model, plugin.ignored_modules) for p in module.parameters()}
    if ignored:
        kwargs["ignored_params"] = ignored

    def free_replaced(module, replaced):
        if ram_efficient:
            return
        # Free each whole parameter once its shard exists (the user's optimizer still holds the old
        # object until it is re-pointed), so the peak is one copy plus a block, not one and a half copies.
        still_used = {id(p) for _, p in model.named_parameters(remove_duplicate=False)}
        for old in replaced:
            if id(old) not in still_used:
                old.data = torch.empty(0, dtype=old.dtype, device=old.device)

    wants_own_unit = wrap_policy(plugin, model) if wrap_policy is not None else plugin.wrap_predicate(model)
    shard_units(model, kwargs, wants_own_unit, can_be_unit=can_be_unit, after_unit=free_replaced)
    if ram_efficient:
        from .streaming import stream_from_rank0

        materialize(model, device, offload=offloads)
        retie(ties)
        # Rank 0 drops each whole tensor as soon as it is sent, so no process ever holds two copies; buffers,
        # non-persistent ones included (they are in no state dict), come from rank 0 too.
        stream_from_rank0(named_tensors(model), full, torch.device(device or "cpu"), consume=True)
    new_params = plain_named_parameters(model)
    return [(old, new_params[name]) for name, old in old_params.items()
            if name in new_params and new_params[name] is not old]


def shard_stages(blocks, stages, plugin, mesh) -> None:
    """A pipeline's FSDP2: each block of this process's stages with parameters, then each stage (the root its
    schedule drives, so the schedule's own hooks hold the reduce-scatter back to the last micro-batch)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    kwargs = dict(mesh=mesh, reshard_after_forward=plugin.reshard_after_forward,
                  mp_policy=plugin.mixed_precision_policy or MixedPrecisionPolicy())
    for block in blocks:
        if any(True for _ in block.parameters()):
            fully_shard(block, **kwargs)
    for stage in stages:
        fully_shard(stage, **kwargs)


def can_be_unit(module) -> bool:
    """fully_shard needs a module that runs (not a ModuleList/ModuleDict container) and has parameters; an
    activation-checkpointing wrapper is not one (the block inside it is)."""
    has_forward = type(module).forward is not torch.nn.Module.forward
    return has_forward and not hasattr(module, "_checkpoint_wrapped_module") and any(True for _ in module.parameters())
