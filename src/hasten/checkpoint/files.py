"""Accelerate's checkpoint files, in one place: their names, how each kind is written and read, and the few rules
that come with them (which device `map_location` names, how saved keys meet a model wrapped differently).

A `save_state` folder holds, in Accelerate's layout:

    model.safetensors / pytorch_model.bin   each prepared model (`_1`, `_2`, ... after the first: `numbered`)
    optimizer.bin, scheduler.bin            each optimizer and scheduler (numbered alike)
    sampler.bin, dl_state_dict.bin          each loader's position / torchdata state (numbered alike)
    scaler.pt                               the fp16 loss scaler
    random_states_<rank>.pkl                every process's RNG states and the step counter
    custom_checkpoint_<i>.pkl               each object given to `register_for_checkpointing`

`Backend` writes and reads the model and optimizer files, `checkpoint/layout.py` (`save_state`) and
`checkpointing.py` (Accelerate's standalone functions) the rest; all three name and read them here. A writer is a
`(name, write(path))` pair: the payload is taken (and, for a background save, staged through `stage`) when the
pair is made, and written when the caller runs `write` on a path of its choosing (a temporary folder, an atomic
sibling). Reading runs no pickled code unless the caller's `load_kwargs` opt in (`fast_io.load_object`).
"""

from __future__ import annotations

import os
import re

from ..core.constants import (
    MODEL_NAME,
    OPTIMIZER_NAME,
    RNG_STATE_NAME,
    SAFE_MODEL_NAME,
    SCALER_NAME,
    SCHEDULER_NAME,
)
from ..core.errors import CheckpointError
from . import state_dicts
from .storage import durable, fast_io, paths

CUSTOM_PATTERN = re.compile(r"^custom_checkpoint_(\d+)\.pkl$")
RNG_PATTERN = re.compile(rf"^{re.escape(RNG_STATE_NAME)}_(\d+)\.pkl$")
_WRAPPER_PREFIXES = ("module.", "_orig_mod.")


# -- names ------------------------------------------------------------------------------------------------------
def numbered(prefix: str, index: int, suffix: str) -> str:
    """Accelerate's file name for the index-th object of a kind in a `save_state` folder (i > 0 adds `_<i>`)."""
    return f"{prefix}{'' if index == 0 else f'_{index}'}{suffix}"


def model_name(index: int, safe_serialization: bool = True) -> str:
    if safe_serialization:
        return numbered(SAFE_MODEL_NAME, index, ".safetensors")
    return numbered(MODEL_NAME, index, ".bin")


def optimizer_name(index: int) -> str:
    return numbered(OPTIMIZER_NAME, index, ".bin")


def scheduler_name(index: int) -> str:
    return numbered(SCHEDULER_NAME, index, ".bin")


def loader_name(stem: str, index: int) -> str:
    """`sampler[_i].bin` (hasten's position of a loader) or `dl_state_dict[_i].bin` (torchdata's state)."""
    return numbered(stem, index, ".bin")


def rng_name(rank: int) -> str:
    return f"{RNG_STATE_NAME}_{rank}.pkl"


def custom_name(index: int) -> str:
    return f"custom_checkpoint_{index}.pkl"


def ranks_with_rng(folder: str) -> list:
    """The ranks that left a `random_states_<rank>.pkl` in `folder`, lowest first."""
    return sorted(int(m.group(1)) for name in paths.names_in(folder) if (m := RNG_PATTERN.match(name)))


def custom_files(folder: str) -> list:
    """[(index, name)] of the `custom_checkpoint_<index>.pkl` files in `folder`, by index."""
    return sorted((int(m.group(1)), name) for name in paths.names_in(folder) if (m := CUSTOM_PATTERN.match(name)))


# -- writers: (name, write(path)) -------------------------------------------------------------------------------
def _as_is(obj, key: str = ""):
    return obj


def object_file(name: str, payload, stage=_as_is) -> tuple:
    """A pickled object (`torch.save`): optimizer, scheduler, loader, scaler, RNG and custom files."""
    staged = (stage or _as_is)(payload, name)
    return name, lambda path: durable.save_object(staged, path)


def tensors_file(name: str, tensors: dict, stage=_as_is) -> tuple:
    """A safetensors file of `tensors` (which must share no memory: see `state_dicts.drop_aliases`)."""
    staged = (stage or _as_is)(tensors, name)
    return name, lambda path: fast_io.save_tensors(staged, path)


def model_files(weights: list, safe_serialization: bool = True, stage=_as_is,
                for_safetensors=state_dicts.drop_aliases) -> list:
    """One file per model state dict: `model[_i].safetensors` (its tensors after `for_safetensors`, which drops
    the later names of tied weights) or `pytorch_model[_i].bin`."""
    if safe_serialization:
        return [tensors_file(model_name(i, True), for_safetensors(state), stage) for i, state in enumerate(weights)]
    return [object_file(model_name(i, False), state, stage) for i, state in enumerate(weights)]


def optimizer_files(optimizers: list, stage=_as_is) -> list:
    return [object_file(optimizer_name(i), optimizer.state_dict(), stage) for i, optimizer in enumerate(optimizers)]


def scheduler_files(schedulers: list, stage=_as_is) -> list:
    return [object_file(scheduler_name(i), scheduler.state_dict(), stage) for i, scheduler in enumerate(schedulers)]


def scaler_file(scaler, stage=_as_is) -> tuple:
    return object_file(SCALER_NAME, scaler.state_dict(), stage)


def custom_object_files(objects: list, stage=_as_is) -> list:
    return [object_file(custom_name(i), obj.state_dict(), stage) for i, obj in enumerate(objects)]


def rng_file(rank: int, step: int, rng_states: dict, stage=_as_is) -> tuple:
    """This process's `random_states_<rank>.pkl`: the step counter and every RNG state (the caller captures them
    with `distributed.rng.capture_rng_states`: this storage floor stays below the process group's)."""
    return object_file(rng_name(rank), {"step": int(step), **rng_states}, stage)


# -- readers ----------------------------------------------------------------------------------------------------
def resolve_map_location(value, device):
    """Where `load_state(map_location=...)` puts optimizer state: None or "cpu" -> "cpu", "on_device" -> `device`
    (this process's device, or a callable giving it, looked up only then). Anything else is a TypeError."""
    if value in (None, "cpu"):
        return "cpu"
    if value == "on_device":
        return device() if callable(device) else device
    raise TypeError(f"map_location must be None, 'cpu' or 'on_device', got {value!r}")


def read(folder: str, name: str, load_kwargs: dict | None = None, map_location="cpu", into=None):
    """One pickled file of the folder (`weights_only` unless `load_kwargs` opt out); a missing file is a
    CheckpointError. `into`: see `fast_io.load_object` (`optimizer_twin`)."""
    return fast_io.load_object(os.path.join(folder, name), load_kwargs, map_location=map_location, into=into)


def optimizer_twin(optimizer):
    """For `read(..., into=)`: the optimizer's own state dict, whose state tensors (AdamW's moments, ...) then
    receive a saved optimizer's bytes in place, when the saved state has the optimizer's shape (its groups hold
    as many parameters); `load_state_dict` then keeps them. Saves the fresh memory (twice the model's size for
    AdamW) and its page faults."""
    def twin(structure):
        own = optimizer.state_dict()
        groups = structure.get("param_groups") if isinstance(structure, dict) else None
        if (not isinstance(groups, list) or len(groups) != len(own["param_groups"])
                or any(not isinstance(g, dict) or len(g.get("params", ())) != len(o["params"])
                       for g, o in zip(groups, own["param_groups"]))):
            return None
        return own
    return twin


def read_if_present(folder: str, name: str, load_kwargs: dict | None = None):
    """As `read`, but None when the file is not there (a kind the checkpoint may lack)."""
    path = os.path.join(folder, name)
    return fast_io.load_object(path, load_kwargs) if paths.is_file(path) else None


def read_model(folder: str, index: int, model, map_location="cpu", load_kwargs: dict | None = None,
               into: dict | None = None) -> dict:
    """The state dict saved for the index-th model: its safetensors file (tied weights filled in again; `into`,
    e.g. the model's own state dict, receives the bytes in place) or else its `.bin` file."""
    safe_path = os.path.join(folder, model_name(index, True))
    if paths.is_file(safe_path):
        return state_dicts.fill_aliases(model, fast_io.load_tensors(safe_path, map_location, into=into))
    bin_path = os.path.join(folder, model_name(index, False))
    if not paths.is_file(bin_path):
        raise CheckpointError(f"checkpoint file {safe_path} is missing (nor is there {os.path.basename(bin_path)})")
    return fast_io.load_object(bin_path, load_kwargs, map_location=map_location)


def model_paths(folder: str, num_models: int) -> list:
    """The model files a load reads into new memory, for prefetching (safetensors weights go into the model
    itself, and optimizer state into the optimizer's own tensors)."""
    return [os.path.join(folder, model_name(i, False)) for i in range(num_models)
            if not paths.is_file(os.path.join(folder, model_name(i, True)))]


def _bare_name(key: str) -> str:
    while key.startswith(_WRAPPER_PREFIXES):
        key = key.split(".", 1)[1]
    # regional compilation (compile_regions) puts `_orig_mod.` inside each compiled block's names
    return key.replace("._orig_mod.", ".")


def match_wrapper_prefixes(model, state_dict: dict) -> dict:
    """Rename keys saved with other wrapper prefixes (`module.` from DDP, `_orig_mod.` from compile) than the
    model has now, so a checkpoint from 2 processes loads into 1 and back."""
    expected = model.state_dict().keys()
    if all(key in expected for key in state_dict):
        return state_dict
    by_bare = {_bare_name(key): key for key in expected}
    return {by_bare.get(_bare_name(key), key): value for key, value in state_dict.items()}


__all__ = [
    "CUSTOM_PATTERN", "RNG_PATTERN", "custom_files", "custom_name", "custom_object_files", "loader_name",
    "match_wrapper_prefixes", "model_files", "model_paths", "model_name", "numbered", "object_file",
    "optimizer_files", "optimizer_name", "optimizer_twin", "ranks_with_rng", "read", "read_if_present", "read_model",
    "resolve_map_location", "rng_file", "rng_name", "scaler_file", "scheduler_files", "scheduler_name", "tensors_file",
]
