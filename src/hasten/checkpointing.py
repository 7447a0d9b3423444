"""Accelerate's standalone checkpoint functions (`accelerate.checkpointing.save_accelerator_state`, ...).

`Accelerator.save_state` (in `hasten.checkpoint.layout`) is what most code calls; these functions write and read the
same file layout for callers that hold the pieces themselves. Each file is written through a temporary
sibling and renamed into place (`checkpoint.durable.atomic_write`), so a crash leaves the old file or the new
one, never half of one. Loading runs no pickled code unless `load_kwargs={"weights_only": False}`, except in
`custom_checkpoint_*.pkl` files, which are unpickled as in Accelerate unless hasten's `strict` setting is on.
"""

from __future__ import annotations

import logging
import os

import torch

from .checkpoint import async_save as background
from .checkpoint import files, state_dicts
from .checkpoint.storage import durable, paths
from .core.constants import DL_STATE_NAME, SAMPLER_NAME, SCALER_NAME
from .distributed.rng import capture_rng_states, restore_rng_states

logger = logging.getLogger(__name__)



def _is_writer(save_on_each_node: bool) -> bool:
    from .state import PartialState

    state = PartialState()
    return state.is_local_main_process if save_on_each_node else state.is_main_process


def clean_state_dict_for_safetensors(state_dict: dict) -> dict:
    """Drop later names of tensors that share memory (tied weights; safetensors refuses them, keeping the first
    name and warning once) and make every tensor contiguous. Returns a new dict; the input is left alone."""
    kept = state_dicts.drop_aliases(state_dict)
    dropped = [name for name, value in state_dict.items() if isinstance(value, torch.Tensor) and name not in kept]
    if dropped:
        # logged, as Accelerate logs it (callers capture the record, not a Python warning)
        logger.warning(f"Removed shared tensor {dropped} while saving: they alias earlier entries of the state "
                       "dict, and loading ties them again")
    cleaned = {}
    for name, value in state_dict.items():
        if name in kept:
            cleaned[name] = value.contiguous() if isinstance(value, torch.Tensor) else value
        elif not isinstance(value, torch.Tensor):
            cleaned[name] = value
    return cleaned


def save_accelerator_state(output_dir: str, model_states: list, optimizers: list, schedulers: list, dataloaders: list,
                           process_index: int, step: int, scaler=None, save_on_each_node: bool = False,
                           safe_serialization: bool = True) -> str:
    """Write models' state dicts, optimizers, schedulers, loader positions, the scaler and this process's RNG
    states into `output_dir` with Accelerate's file names; returns `output_dir`.

    The main process (or each node's local main with `save_on_each_node`) writes the shared files; every
    process writes its own `random_states_<process_index>.pkl`.
    """
    output_dir = os.fspath(output_dir)
    paths.make_folder(output_dir)
    plan = []
    if _is_writer(save_on_each_node):
        plan += files.model_files(model_states, safe_serialization, for_safetensors=clean_state_dict_for_safetensors)
        plan += files.optimizer_files(optimizers) + files.scheduler_files(schedulers)
        for i, loader in enumerate(dataloaders):
            state_dict = getattr(loader, "state_dict", None)
            stem = DL_STATE_NAME if getattr(loader, "use_stateful_dataloader", False) else SAMPLER_NAME
            if callable(state_dict):
                plan.append(files.object_file(files.loader_name(stem, i), state_dict()))
        if scaler is not None:
            plan.append(files.scaler_file(scaler))
    plan.append(files.rng_file(process_index, step, capture_rng_states()))
    for name, write in plan:
        durable.atomic_write(os.path.join(output_dir, name), write)
    logger.info("saved state to %s", output_dir)
    return output_dir


def _device():
    from .state import PartialState

    return PartialState().device


def load_accelerator_state(input_dir: str, models: list, optimizers: list, schedulers: list, dataloaders: list,
                           process_index: int, scaler=None, map_location=None, load_kwargs: dict | None = None,
                           **load_model_func_kwargs) -> dict:
    """Read what `save_accelerator_state` wrote back into the given objects. Returns the attributes the caller
    should take over (`{"step": ...}` when the RNG file recorded one).

    `map_location`: None or "cpu" (optimizer state on the CPU) or "on_device" (on this process's device).
    Extra keyword arguments go to each model's `load_state_dict` (e.g. `strict=False`).
    """
    input_dir = os.fspath(input_dir)
    background.wait_for_staging()  # an async save_state may still be copying these parameters
    location = files.resolve_map_location(map_location, _device)
    load_kwargs = dict(load_kwargs or {})
    for i, model in enumerate(models):
        model.load_state_dict(files.read_model(input_dir, i, model, location, load_kwargs), **load_model_func_kwargs)
    for i, optimizer in enumerate(optimizers):
        optimizer.load_state_dict(files.read(input_dir, files.optimizer_name(i), load_kwargs, map_location=location))
    for i, scheduler in enumerate(schedulers):
        scheduler.load_state_dict(files.read(input_dir, files.scheduler_name(i), load_kwargs))
    for i, loader in enumerate(dataloaders):
        # As in Accelerate, only a use_stateful_dataloader loader is moved; a plain one starts its pass afresh
        # (scripts that skip batches by hand after loading would otherwise skip twice).
        if not getattr(loader, "use_stateful_dataloader", False):
            continue
        if not callable(getattr(loader, "load_state_dict", None)):
            continue
        state = files.read_if_present(input_dir, files.loader_name(DL_STATE_NAME, i), load_kwargs)
        if state is not None:
            loader.load_state_dict(state)
    if scaler is not None:
        scaler.load_state_dict(files.read(input_dir, SCALER_NAME, load_kwargs))
    overrides = {}
    # A missing file is allowed (a checkpoint from fewer processes); a corrupt one is an error, not a shrug.
    payload = files.read_if_present(input_dir, files.rng_name(process_index), load_kwargs)
    if payload is not None:
        if "step" in payload:
            overrides["step"] = payload["step"]
        restore_rng_states(payload)
    else:
        logger.info("no random states for process %d in %s; RNG states left as they are", process_index, input_dir)
    return overrides


def save_custom_state(obj, path: str, index: int = 0, save_on_each_node: bool = False) -> None:
    """Write `obj.state_dict()` to `path/custom_checkpoint_<index>.pkl` (main process, or each node's local main)."""
    if _is_writer(save_on_each_node):
        name, write = files.object_file(files.custom_name(index), obj.state_dict())
        durable.atomic_write(os.path.join(os.fspath(path), name), write)


def load_custom_state(obj, path: str, index: int = 0, load_kwargs: dict | None = None) -> None:
    """Load `path/custom_checkpoint_<index>.pkl` into `obj.load_state_dict`.

    As in Accelerate, the file is unpickled with `weights_only=False` (the state may hold any Python object).
    Under hasten's `strict` setting it is read with `weights_only=True` and a file holding pickled objects raises
    `UnsafeCheckpointError`; `load_kwargs={"weights_only": False}` (a hasten addition, passed to `torch.load`)
    then opts in. An explicit `weights_only` in `load_kwargs` always wins.
    """
    from .config.resolve import strict

    kwargs = dict(load_kwargs or {})
    if not strict():
        kwargs.setdefault("weights_only", False)
    obj.load_state_dict(files.read(os.fspath(path), files.custom_name(index), kwargs))
