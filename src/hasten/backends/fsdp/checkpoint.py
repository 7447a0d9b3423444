"""Reading and writing FSDP model/optimizer state, with Accelerate's file names.

Sharded state goes through torch.distributed.checkpoint (DCP): every process writes only its own shard, and
DCP reshards on load, so N processes can resume what M processes saved. A whole ("full") state dict is
gathered one tensor at a time and kept on the main process only, so the other processes never hold more
than their shard plus one gathered tensor.

Layout inside a `save_state` folder (i = index of the model/optimizer in prepare order):

    SHARDED_STATE_DICT   pytorch_model_fsdp_<i>/   (DCP, key "model")   optimizer_<i>/  (DCP, key "optimizer")
    FULL_STATE_DICT      pytorch_model_fsdp.bin, pytorch_model_fsdp_<i>.bin    optimizer.bin, optimizer_<i>.bin
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from ...checkpoint.storage import checksum, durable, fast_io, paths
from ...checkpoint.storage import dcp as layer_dcp
from ...core.constants import FSDP_MODEL_NAME as MODEL_NAME
from ...core.constants import OPTIMIZER_NAME
from ...core.errors import CheckpointError
from ...distributed.control import several_processes
from ..unwrap import is_fsdp1

DCP_METADATA = ".metadata"


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def is_sharded(plugin) -> bool:
    from torch.distributed.fsdp import StateDictType

    return plugin.state_dict_type != StateDictType.FULL_STATE_DICT


def sharded_name(stem: str, index: int) -> str:
    return f"{stem}_{index}"


def full_name(stem: str, index: int) -> str:
    return f"{stem}.bin" if index == 0 else f"{stem}_{index}.bin"


def _is_dcp_dir(path: str) -> bool:
    return paths.is_file(os.path.join(path, DCP_METADATA))


# -- whole state dicts, gathered tensor by tensor ---------------------------------------------------------------
def _wants(config) -> tuple[bool, bool]:
    """(offload_to_cpu, rank0_only) of the plugin's `state_dict_config` / `optim_state_dict_config` (a Full* or
    Sharded* config; Sharded ones have no rank0_only). None: the plugin's defaults, (True, True)."""
    return bool(getattr(config, "offload_to_cpu", True)), bool(getattr(config, "rank0_only", True))


def _gather(get, config) -> dict:
    """`get(options)` gathered whole, kept on the CPU and/or on rank 0 only as `config` asks."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    offload, rank0_only = _wants(config)
    if offload and rank0_only:
        # torch's cpu_offload also drops each gathered tensor on the other ranks right away: the cheap path.
        return get(StateDictOptions(full_state_dict=True, cpu_offload=True))
    state = get(StateDictOptions(full_state_dict=True, cpu_offload=False))  # every rank gathers on its device
    if rank0_only and _rank() != 0:
        return {}
    if offload:
        from ...core.nested import recursively_apply

        state = recursively_apply(lambda t: t.cpu(), state, error_on_other_type=False)
    return state


def _fsdp1_full_context(model, config=None, optim_config=None):
    """FSDP1's own gathering, with the plugin's offload/rank0_only; its CPU offload of the result fails when the
    device is the CPU, so it is skipped there (the result is in CPU memory anyway)."""
    from torch.distributed.fsdp import (
        FullOptimStateDictConfig,
        FullStateDictConfig,
        FullyShardedDataParallel,
        StateDictType,
    )

    on_cpu = next(model.parameters()).device.type == "cpu"
    offload, rank0_only = _wants(config)
    optim_offload, optim_rank0_only = _wants(optim_config)
    return FullyShardedDataParallel.state_dict_type(
        model, StateDictType.FULL_STATE_DICT, FullStateDictConfig(offload_to_cpu=offload and not on_cpu,
                                                                  rank0_only=rank0_only),
        FullOptimStateDictConfig(offload_to_cpu=optim_offload and not on_cpu, rank0_only=optim_rank0_only),
    )


def full_model_state_dict(model, config=None) -> dict:
    """The whole model (unsharded names, e.g. `layers.0.weight`); by default (`config` None, or the plugin's
    `state_dict_config` with offload_to_cpu and rank0_only) in CPU memory on the main process, `{}` elsewhere."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    if is_fsdp1(model):
        with _fsdp1_full_context(model, config):
            state = model.state_dict()
        return state if _rank() == 0 or not _wants(config)[1] else {}
    return _gather(lambda options: get_model_state_dict(model, options=options), config)


def load_full_model_state_dict(model, state_dict: dict, strict: bool = True):
    """Load a whole state dict that every process has read; each keeps its shard."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
    )

    return set_model_state_dict(model, state_dict, options=StateDictOptions(full_state_dict=True, strict=strict))


def full_optimizer_state_dict(model, optimizer, config=None) -> dict:
    """The whole optimizer state, kept as the plugin's `optim_state_dict_config` asks (see full_model_state_dict)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    if is_fsdp1(model):
        from torch.distributed.fsdp import FullyShardedDataParallel

        with _fsdp1_full_context(model, optim_config=config):
            state = FullyShardedDataParallel.optim_state_dict(model, optimizer)
        return state if _rank() == 0 or not _wants(config)[1] else {}
    return _gather(lambda options: get_optimizer_state_dict(model, optimizer, options=options), config)


def load_full_optimizer_state_dict(model, optimizer, state_dict: dict) -> None:
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_optimizer_state_dict,
    )

    set_optimizer_state_dict(model, optimizer, state_dict, options=StateDictOptions(full_state_dict=True))


# -- save_state / load_state -----------------------------------------------------------------------------------
def _sharded_options(config):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(cpu_offload=_wants(config)[0])


def save_model(model, output_dir: str, index: int, sharded: bool, config=None):
    """Write one model's state; returns the file/folder name this process wrote (None if it wrote nothing).
    `config`: the plugin's `state_dict_config` (its offload_to_cpu, and rank0_only for whole state dicts)."""
    if sharded:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        name = sharded_name(MODEL_NAME, index)
        state = get_model_state_dict(model, options=_sharded_options(config))
        layer_dcp.save({"model": state}, os.path.join(output_dir, name))
        return name
    name = full_name(MODEL_NAME, index)
    state = full_model_state_dict(model, config)
    if _rank() != 0:
        return None
    durable.save_object(state, os.path.join(output_dir, name))
    return name


def per_rank_name(index: int) -> str:
    return f"{MODEL_NAME}_{index}_rank{_rank()}.bin"


def _local(value):
    """This process's piece of a sharded tensor, as a plain tensor (safe to pickle with weights_only)."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor
    from torch.distributed.tensor import DTensor

    if isinstance(value, DTensor):
        return value.to_local()
    if isinstance(value, ShardedTensor):
        return value.local_tensor()
    return value


def save_model_per_rank(model, output_dir: str, index: int, config=None) -> str:
    """Each process `torch.save`s its own shards (plain tensors), no collective: Accelerate's `use_dcp=False`."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    state = get_model_state_dict(model, options=_sharded_options(config))
    name = per_rank_name(index)
    durable.save_object({key: _local(value) for key, value in state.items()}, os.path.join(output_dir, name))
    return name


def load_model_per_rank(model, input_dir: str, index: int) -> None:
    """Read what `save_model_per_rank` wrote on this rank into this process's shards (same process count)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    path = os.path.join(input_dir, per_rank_name(index))
    if not paths.is_file(path):
        raise CheckpointError(f"{path} is missing: use_dcp=False checkpoints hold one file per process and load on "
                              "the same number of processes (or save with use_dcp=True to reshard)")
    saved = fast_io.load_object(path, {"weights_only": True})
    state = get_model_state_dict(model)  # views of the parameters' own shards
    with torch.no_grad():
        for key, value in state.items():
            target = _local(value)
            if key not in saved or saved[key].shape != target.shape:
                raise CheckpointError(f"{path}: {key} is missing or has another shape than this process's shard "
                                      "(saved on another number of processes?)")
            target.copy_(saved[key])


def save_optimizer(model, optimizer, output_dir: str, index: int, sharded: bool, config=None):
    """As save_model; `config` is the plugin's `optim_state_dict_config`."""
    if sharded:
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        name = sharded_name(OPTIMIZER_NAME, index)
        state = get_optimizer_state_dict(model, optimizer, options=_sharded_options(config))
        layer_dcp.save({"optimizer": state}, os.path.join(output_dir, name))
        return name
    name = full_name(OPTIMIZER_NAME, index)
    state = full_optimizer_state_dict(model, optimizer, config)
    if _rank() != 0:
        return None
    durable.save_object(state, os.path.join(output_dir, name))
    return name


def async_save_sharded(model, optimizer, output_dir: str, index: int, process_group):
    """Start DCP's asynchronous save of one model's (optimizer is None) or one optimizer's shards: staged to
    CPU memory before this returns, uploaded in DCP's own thread on `process_group`; returns its future."""
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    if optimizer is None:
        name, state = sharded_name(MODEL_NAME, index), {"model": get_model_state_dict(model)}
    else:
        name, state = sharded_name(OPTIMIZER_NAME, index), {"optimizer": get_optimizer_state_dict(model, optimizer)}
    return layer_dcp.async_save(state, os.path.join(output_dir, name), process_group=process_group)


def _find(input_dir: str, stem: str, index: int) -> tuple[str, bool]:
    """(path, is_sharded) of what was saved for model/optimizer `index`, whichever state dict type wrote it."""
    directory = os.path.join(input_dir, sharded_name(stem, index))
    if _is_dcp_dir(directory):
        return directory, True
    file = os.path.join(input_dir, full_name(stem, index))
    if paths.is_file(file):
        return file, False
    raise CheckpointError(
        f"{input_dir} has no FSDP state for {stem} {index}: expected the folder {sharded_name(stem, index)}/ "
        f"(sharded) or the file {full_name(stem, index)} (full); was it saved with the same models and optimizers?"
    )


def _load_planner(state: dict):
    """DCP's load planner, told not to split ShardedTensors unless one holds another sharded tensor (2-D layouts).

    torch 2.13's planner drops a ShardedTensor with no rows on this process (FSDP1 SHARDED_STATE_DICT chunks every
    parameter by its first dimension, so a (1, n) weight has rows on rank 0 only) and then takes the missing key
    for a pre-2.4 checkpoint, re-reads the state under the old key layout, and fails on
    `Missing key in checkpoint state_dict: optimizer.param_groups` (docs/fsdp.md). Kept whole, every key is found.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed._shard.sharded_tensor import ShardedTensor
    from torch.distributed.tensor import DTensor

    def nested(value) -> bool:
        if isinstance(value, dict):
            return any(nested(v) for v in value.values())
        if isinstance(value, (list, tuple)):
            return any(nested(v) for v in value)
        return isinstance(value, ShardedTensor) and any(
            isinstance(shard.tensor, (ShardedTensor, DTensor)) for shard in value.local_shards()
        )

    return dcp.DefaultLoadPlanner(flatten_sharded_tensors=nested(state))


def load_model(model, input_dir: str, index: int, *, strict: bool = True, map_location="cpu",
               load_kwargs: dict | None = None) -> None:
    """Restore one model. Sharded (DCP) state is read straight into this process's shards where they live;
    a whole file is read with `torch.load(map_location=, **load_kwargs)` (weights_only unless opted out).
    `strict` as in `load_state_dict`: False tolerates keys missing from the model or the checkpoint."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict

    path, sharded = _find(input_dir, MODEL_NAME, index)
    if sharded:
        import torch.distributed.checkpoint as dcp

        # DCP reads into the tensors it is given: this process's shards, however many processes saved them.
        state = {"model": get_model_state_dict(model)}
        planner = _load_planner(state)
        if not strict:
            planner = dcp.DefaultLoadPlanner(flatten_sharded_tensors=planner.flatten_sharded_tensors,
                                             allow_partial_load=True)
        layer_dcp.load(state, path, planner=planner)
        set_model_state_dict(model, state["model"], options=StateDictOptions(strict=strict))
        return
    load_full_model_from_rank0(model, path, strict=strict, map_location=map_location, load_kwargs=load_kwargs)


def _read_whole(path: str, load_kwargs, map_location):
    """A whole-state file, memory-mapped (`mmap`: the pages are read as the broadcast needs them, and processes of
    a machine that read it share them), through hasten's safe loader (`load_kwargs` as `load_state` was given)."""
    return fast_io.load_object(path, {"mmap": True, **(load_kwargs or {})}, map_location)


def load_full_model_from_rank0(model, path: str, *, strict: bool = True, map_location="cpu",
                               load_kwargs: dict | None = None) -> None:
    """Load a whole-model file that only rank 0 reads; every tensor is broadcast from it, one at a time, and each
    process keeps its shard. Every rank reading the file cost one whole model of host RAM per process (a 70B bf16
    model on 8 ranks: ~1.1 TB)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    state = _read_whole(path, load_kwargs, map_location) if _rank() == 0 else {}
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=several_processes(), strict=strict)
    set_model_state_dict(model, state, options=options)


def load_optimizer(model, optimizer, input_dir: str, index: int, *, map_location="cpu",
                   load_kwargs: dict | None = None) -> None:
    path, sharded = _find(input_dir, OPTIMIZER_NAME, index)
    if sharded:
        load_optimizer_flat_or_not(model, optimizer, path)
        return
    if is_fsdp1(model):
        # FSDP1's optimizer state is not DTensors, which torch's rank-0 broadcast needs: every rank maps the file.
        load_full_optimizer_state_dict(model, optimizer, _read_whole(path, load_kwargs, map_location))
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    state = _read_whole(path, load_kwargs, map_location) if _rank() == 0 else {}
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=several_processes())
    set_optimizer_state_dict(model, optimizer, state, options=options)


def _saved_flat(path: str, model) -> bool:
    """Whether a DCP optimizer folder holds flattened state (`param_groups.<parameter name>.lr`, as pipelined runs
    write it: each stage has the param groups of its own parameters only) rather than a `param_groups` list."""
    keys = layer_dcp.reader(path).read_metadata().state_dict_metadata
    prefixes = tuple(f"optimizer.param_groups.{name.replace('_checkpoint_wrapped_module.', '')}."
                     for name, _ in model.named_parameters())
    return any(key.startswith(prefixes) for key in keys)


def load_optimizer_flat_or_not(model, optimizer, path: str, one_stage: bool = False) -> None:
    """Load a DCP optimizer folder, flattened or not, into `optimizer`. `one_stage`: `model` holds some of the
    whole model's parameters (a pipeline stage), under the whole model's names."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    options = StateDictOptions(flatten_optimizer_state_dict=_saved_flat(path, model))
    # get_optimizer_state_dict creates the (zero) state tensors of a fresh optimizer for DCP to fill.
    state = {"optimizer": get_optimizer_state_dict(model, optimizer, options=options)}
    layer_dcp.load(state, path, planner=_load_planner(state))
    loaded = state["optimizer"]
    if one_stage and not options.flatten_optimizer_state_dict:
        # A whole model's param groups read into one stage: keep the names this process holds.
        own = {name.replace("_checkpoint_wrapped_module.", "") for name, _ in model.named_parameters()}
        for group in loaded.get("param_groups", []):
            group["params"] = [name for name in group["params"] if name in own]
    set_optimizer_state_dict(model, optimizer, loaded, options=options)


# -- merge-weights ---------------------------------------------------------------------------------------------
def _check_dcp_dir(checkpoint_dir: str) -> None:
    if _is_dcp_dir(checkpoint_dir):
        return
    if not paths.is_dir(checkpoint_dir):
        raise CheckpointError(f"{checkpoint_dir} does not exist or is not a folder")
    inside = [name for name in paths.names_in(checkpoint_dir) if _is_dcp_dir(os.path.join(checkpoint_dir, name))]
    models = [name for name in inside if name.startswith(MODEL_NAME)]
    inside = models or inside
    if inside:
        hint = os.path.join(checkpoint_dir, inside[0])
        raise CheckpointError(
            f"{checkpoint_dir} is the folder that holds the checkpoints, not a sharded checkpoint; point at one of its "
            f"sharded model folders ({', '.join(inside)}), e.g. {hint}"
        )
    raise CheckpointError(
        f"{checkpoint_dir} is not a sharded (torch.distributed.checkpoint) checkpoint: it has no {DCP_METADATA} file; "
        "save with fsdp state_dict_type=SHARDED_STATE_DICT"
    )


def load_sharded_state_dict(checkpoint_dir: str) -> dict:
    """Every tensor of a DCP model checkpoint, whole, in one process (no process group needed)."""
    from torch.distributed.checkpoint.format_utils import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    _check_dcp_dir(checkpoint_dir)
    state: dict = {}
    _load_state_dict(state, storage_reader=layer_dcp.reader(checkpoint_dir), planner=_EmptyStateDictLoadPlanner(),
                     no_dist=True)
    if set(state) == {"optimizer"}:
        raise CheckpointError(
            f"{checkpoint_dir} holds optimizer state, not model weights; point at the pytorch_model_fsdp_<i> folder"
        )
    if set(state) == {"model"} and isinstance(state["model"], dict):
        state = state["model"]
    return state


def merge_fsdp_weights(checkpoint_dir: str, output_path: str, safe_serialization: bool = True,
                       remove_checkpoint_dir: bool = False) -> str:
    """Turn a sharded model checkpoint (`.../pytorch_model_fsdp_0`) into one `model.safetensors` (or `.bin`).

    Returns the written file. Under a process group only the main process writes.
    """
    checkpoint_dir = os.path.expanduser(str(checkpoint_dir))
    output_path = os.path.expanduser(str(output_path))
    _check_dcp_dir(checkpoint_dir)
    name = "model.safetensors" if safe_serialization else "pytorch_model.bin"
    target = os.path.join(output_path, name)
    if _rank() == 0:
        state = load_sharded_state_dict(checkpoint_dir)
        tensors = {key: value.contiguous() for key, value in state.items() if isinstance(value, torch.Tensor)}
        paths.make_folder(output_path)
        if safe_serialization:
            fast_io.save_tensors(tensors, target)
        else:
            durable.save_object(tensors, target)
        checksum.forget(target)  # a model file, not part of a checkpoint's commit
        if remove_checkpoint_dir:
            durable.remove_tree(checkpoint_dir)
    if dist.is_available() and dist.is_initialized():
        from ...distributed.control import barrier

        barrier()
    return target
