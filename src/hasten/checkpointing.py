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

from .backends.base import numbered
from .checkpoint import async_save as background
from .checkpoint import durable, fast_io, state_dicts
from .core.constants import (
    DL_STATE_NAME,
    MODEL_NAME,
    OPTIMIZER_NAME,
    RNG_STATE_NAME,
    SAFE_MODEL_NAME,
    SAMPLER_NAME,
    SCALER_NAME,
    SCHEDULER_NAME,
)
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


def _write(path: str, writer) -> None:
    durable.atomic_write(path, writer)


def _rng_payload(step: int) -> dict:
    """Accelerate's `random_states_<rank>.pkl` content: the step and every RNG state (hasten.distributed.rng's capture)."""
    return {"step": int(step), **capture_rng_states()}


def save_accelerator_state(output_dir: str, model_states: list, optimizers: list, schedulers: list, dataloaders: list,
                           process_index: int, step: int, scaler=None, save_on_each_node: bool = False,
                           safe_serialization: bool = True) -> str:
    """Write models' state dicts, optimizers, schedulers, loader positions, the scaler and this process's RNG
    states into `output_dir` with Accelerate's file names; returns `output_dir`.

    The main process (or each node's local main with `save_on_each_node`) writes the shared files; every
    process writes its own `random_states_<process_index>.pkl`.
    """
    output_dir = os.fspath(output_dir)
    os.makedirs(output_dir, exist_ok=True)
    path = lambda name: os.path.join(output_dir, name)  # noqa: E731
    if _is_writer(save_on_each_node):
        for i, state in enumerate(model_states):
            if safe_serialization:
                tensors = clean_state_dict_for_safetensors(state)
                _write(path(numbered(SAFE_MODEL_NAME, i, ".safetensors")), lambda p, t=tensors: fast_io.save_tensors(t, p))
            else:
                _write(path(numbered(MODEL_NAME, i, ".bin")), lambda p, s=state: durable.save_object(s, p))
        for stem, objects in ((OPTIMIZER_NAME, optimizers), (SCHEDULER_NAME, schedulers)):
            for i, obj in enumerate(objects):
                _write(path(numbered(stem, i, ".bin")), lambda p, s=obj.state_dict(): durable.save_object(s, p))
        for i, loader in enumerate(dataloaders):
            state_dict = getattr(loader, "state_dict", None)
            stem = DL_STATE_NAME if getattr(loader, "use_stateful_dataloader", False) else SAMPLER_NAME
            if callable(state_dict):
                _write(path(numbered(stem, i, ".bin")), lambda p, s=state_dict(): durable.save_object(s, p))
        if scaler is not None:
            _write(path(SCALER_NAME), lambda p: durable.save_object(scaler.state_dict(), p))
    _write(path(f"{RNG_STATE_NAME}_{process_index}.pkl"), lambda p: durable.save_object(_rng_payload(step), p))
    logger.info("saved state to %s", output_dir)
    return output_dir


def _map_location(map_location):
    if map_location not in (None, "cpu", "on_device"):
        raise TypeError(f"map_location must be None, 'cpu' or 'on_device', got {map_location!r}")
    if map_location == "on_device":
        from .state import PartialState

        return PartialState().device
    return "cpu"


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
    location = _map_location(map_location)
    load_kwargs = dict(load_kwargs or {})
    path = lambda name: os.path.join(input_dir, name)  # noqa: E731
    for i, model in enumerate(models):
        safe = path(numbered(SAFE_MODEL_NAME, i, ".safetensors"))
        if os.path.isfile(safe):
            state = state_dicts.fill_aliases(model, fast_io.load_tensors(safe, device=location))
        else:
            state = fast_io.load_object(path(numbered(MODEL_NAME, i, ".bin")), load_kwargs, map_location=location)
        model.load_state_dict(state, **load_model_func_kwargs)
    for i, optimizer in enumerate(optimizers):
        optimizer.load_state_dict(fast_io.load_object(path(numbered(OPTIMIZER_NAME, i, ".bin")), load_kwargs, map_location=location))
    for i, scheduler in enumerate(schedulers):
        scheduler.load_state_dict(fast_io.load_object(path(numbered(SCHEDULER_NAME, i, ".bin")), load_kwargs))
    for i, loader in enumerate(dataloaders):
        # As in Accelerate, only a use_stateful_dataloader loader is moved; a plain one starts its pass afresh
        # (scripts that skip batches by hand after loading would otherwise skip twice).
        if not getattr(loader, "use_stateful_dataloader", False):
            continue
        file = path(numbered(DL_STATE_NAME, i, ".bin"))
        if os.path.isfile(file) and callable(getattr(loader, "load_state_dict", None)):
            loader.load_state_dict(fast_io.load_object(file, load_kwargs))
    if scaler is not None:
        scaler.load_state_dict(fast_io.load_object(path(SCALER_NAME), load_kwargs))
    overrides = {}
    rng_file = path(f"{RNG_STATE_NAME}_{process_index}.pkl")
    if os.path.isfile(rng_file):
        # A missing file is allowed (a checkpoint from fewer processes); a corrupt one is an error, not a shrug.
        payload = fast_io.load_object(rng_file, load_kwargs)
        if "step" in payload:
            overrides["step"] = payload["step"]
        restore_rng_states(payload)
    else:
        logger.info("no random states for process %d in %s; RNG states left as they are", process_index, input_dir)
    return overrides


def save_custom_state(obj, path: str, index: int = 0, save_on_each_node: bool = False) -> None:
    """Write `obj.state_dict()` to `path/custom_checkpoint_<index>.pkl` (main process, or each node's local main)."""
    if _is_writer(save_on_each_node):
        target = os.path.join(os.fspath(path), f"custom_checkpoint_{index}.pkl")
        _write(target, lambda p: durable.save_object(obj.state_dict(), p))


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
    file = os.path.join(os.fspath(path), f"custom_checkpoint_{index}.pkl")
    obj.load_state_dict(fast_io.load_object(file, kwargs, map_location="cpu"))
