"""`save_state` / `load_state` / `save_model`: Accelerate's checkpoint layout, written so that nothing is lost.

A save goes to a hidden temporary folder next to the target. Every process writes and fsyncs its files
there; once all have finished, the committing process writes `hasten_checkpoint.json` (the file list with
sizes) and renames the folder into place. A process killed at any moment leaves either the new checkpoint,
whole, or nothing that `load_state` would take for one. Loading runs no pickled code unless asked to.
"""

from __future__ import annotations

import logging
import os
import random
import re
import time
import uuid

import numpy as np
import torch

from . import checkpoint_io as io
from .errors import CheckpointError, ConfigError

logger = logging.getLogger(__name__)

MODEL_NAME, SAFE_MODEL_NAME = "pytorch_model", "model"
OPTIMIZER_NAME, SCHEDULER_NAME, SAMPLER_NAME = "optimizer", "scheduler", "sampler"
SCALER_NAME = "scaler.pt"
RNG_STATE_NAME = "random_states"
GRADIENTS_NAME = "gradients"  # hasten only: gradients accumulated so far, when saved mid-window
CUSTOM_PATTERN = re.compile(r"^custom_checkpoint_(\d+)\.pkl$")
_DEVICE_RNGS = ("cuda", "xpu", "npu", "mlu", "musa", "sdaa", "hpu")


def _numbered(prefix: str, index: int, suffix: str) -> str:
    return f"{prefix}{'' if index == 0 else f'_{index}'}{suffix}"


# -- collectives (no-ops in one process) ------------------------------------------------------------------------
def _all_gather(state, value) -> list:
    if state.num_processes == 1 or not state.use_distributed:
        return [value]
    import torch.distributed as dist

    values = [None] * state.num_processes
    dist.all_gather_object(values, value)
    return values


def _broadcast(state, value):
    if state.num_processes == 1 or not state.use_distributed:
        return value
    import torch.distributed as dist

    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _raise_failures(results: list, what: str) -> None:
    """`results[rank]` is None or an error message; raise one error naming every failed rank."""
    failures = [f"rank {rank}: {message}" for rank, message in enumerate(results) if message]
    if failures:
        raise CheckpointError(f"{what} failed on {len(failures)} process(es): " + "; ".join(failures))


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


# -- where checkpoints live -------------------------------------------------------------------------------------
def _checkpoints_root(config) -> str:
    if config.project_dir is None:
        raise ConfigError(
            "automatic_checkpoint_naming needs a project directory: pass Accelerator(project_dir=...) or "
            "ProjectConfiguration(project_dir=...)"
        )
    return os.path.join(os.path.expanduser(config.project_dir), "checkpoints")


def _number_in(name: str):
    match = re.search(r"\d+", name)
    return int(match.group()) if match else None


def list_checkpoints(root: str) -> list:
    """Checkpoint folders under `root`, oldest first (by the first number in the name, as Accelerate sorts)."""
    if not os.path.isdir(root):
        return []
    entries = []
    for name in os.listdir(root):
        path = os.path.join(root, name)
        if name.startswith(".") or not os.path.isdir(path) or _number_in(name) is None:
            continue
        entries.append((_number_in(name), name, path))
    return [path for _, _, path in sorted(entries)]


def newest_checkpoint(root: str):
    """The newest folder under `root` that is a complete checkpoint (hasten marker verified, or written by
    Accelerate, which has no marker); damaged or half-written ones are skipped with a warning."""
    for path in reversed(list_checkpoints(root)):
        try:
            marker = io.read_marker(path)
            if marker is None:
                if os.path.isfile(os.path.join(path, f"{RNG_STATE_NAME}_0.pkl")):
                    return path
                continue
            io.verify_files(path, marker)
            return path
        except CheckpointError as error:
            logger.warning("skipping checkpoint %s: %s", path, error)
    return None


def _recover(target: str) -> None:
    """Finish or undo a replacement of `target` that a crash interrupted (see `_commit`)."""
    parent, name = os.path.split(target)
    if not os.path.isdir(parent):
        return
    olds = sorted(n for n in os.listdir(parent) if n.startswith(f".{name}{io.OLD_TAG}"))
    for old in olds:
        old_path = os.path.join(parent, old)
        if not os.path.exists(target) and io.is_complete(old_path):
            os.rename(old_path, target)
            io.fsync_dir(parent)
        else:
            io.remove_tree(old_path)


def _remove_stale_temps(parent: str) -> None:
    if not os.path.isdir(parent):
        return
    for name in os.listdir(parent):
        if name.startswith(".") and io.TEMP_TAG in name:
            path = os.path.join(parent, name)
            io.remove_tree(path) if os.path.isdir(path) else os.remove(path)


def _rotate(root: str, keep: str, total_limit: int, rank: int = 0) -> None:
    """Delete the oldest checkpoints so that `total_limit` remain; the one just written always stays."""
    others = [p for p in list_checkpoints(root) if os.path.abspath(p) != os.path.abspath(keep)]
    excess = len(others) + 1 - total_limit
    for path in others[:max(excess, 0)]:
        # Rename first so that a crash mid-delete leaves a hidden folder, not a half-deleted checkpoint.
        doomed = os.path.join(root, f".{os.path.basename(path)}{io.TEMP_TAG}rotated")
        os.rename(path, doomed)
        io.crash_point(rank)
        io.remove_tree(doomed)
    io.fsync_dir(root)


# -- what goes into a checkpoint --------------------------------------------------------------------------------
def _rng_payload(step: int) -> dict:
    """Accelerate's `random_states_<i>.pkl` keys, in types `torch.load(weights_only=True)` accepts."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    payload = {
        "step": int(step),
        "random_state": random.getstate(),
        "numpy_random_seed": (kind, keys.tolist(), int(pos), int(has_gauss), float(cached)),
        "torch_manual_seed": torch.get_rng_state(),
    }
    for name in _DEVICE_RNGS:
        module = getattr(torch, name, None)
        if module is not None and getattr(module, "is_available", lambda: False)() and hasattr(module, "get_rng_state_all"):
            payload[f"torch_{name}_manual_seed"] = module.get_rng_state_all()
    return payload


def _restore_rng(payload: dict) -> None:
    version, inner, gauss = payload["random_state"]
    random.setstate((version, tuple(inner), gauss))
    kind, keys, pos, has_gauss, cached = payload["numpy_random_seed"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), int(pos), int(has_gauss), float(cached)))
    torch.set_rng_state(torch.as_tensor(payload["torch_manual_seed"], dtype=torch.uint8).cpu())
    for name in _DEVICE_RNGS:
        key = f"torch_{name}_manual_seed"
        module = getattr(torch, name, None)
        if key in payload and module is not None and getattr(module, "is_available", lambda: False)():
            states = payload[key] if isinstance(payload[key], (list, tuple)) else [payload[key]]
            module.set_rng_state_all([torch.as_tensor(s, dtype=torch.uint8).cpu() for s in states])


def _gradients(model) -> dict:
    """Gradients accumulated but not yet applied (a save in the middle of an accumulation window)."""
    return {name: p.grad for name, p in model.named_parameters() if p.grad is not None}


def _loader_state(loader):
    state_dict = getattr(loader, "state_dict", None)
    return state_dict() if callable(state_dict) else None


def _writer(config, accelerator) -> bool:
    return accelerator.is_local_main_process if config.save_on_each_node else accelerator.is_main_process


def _plan_files(accelerator, weights: list, models: list, safe_serialization: bool, rank: int, writer: bool,
                backend_writes: bool) -> list:
    """(file name, write function) for everything this process writes."""
    plan = []
    if writer and not backend_writes:
        for i, state_dict in enumerate(weights):
            if safe_serialization:
                tensors = io.drop_aliases(state_dict)
                plan.append((_numbered(SAFE_MODEL_NAME, i, ".safetensors"), lambda p, t=tensors: io.save_tensors(t, p)))
            else:
                plan.append((_numbered(MODEL_NAME, i, ".bin"), lambda p, s=state_dict: io.save_object(s, p)))
        for i, opt in enumerate(accelerator._optimizers):
            model = models[i] if i < len(models) else (models[0] if models else None)
            state = accelerator._backend.optimizer_state_dict(opt, model)
            plan.append((_numbered(OPTIMIZER_NAME, i, ".bin"), lambda p, s=state: io.save_object(s, p)))
    if writer:
        for i, scheduler in enumerate(accelerator._schedulers):
            plan.append((_numbered(SCHEDULER_NAME, i, ".bin"), lambda p, s=scheduler.state_dict(): io.save_object(s, p)))
        if accelerator.scaler is not None:
            plan.append((SCALER_NAME, lambda p, s=accelerator.scaler.state_dict(): io.save_object(s, p)))
        for i, obj in enumerate(accelerator._custom_objects):
            plan.append((f"custom_checkpoint_{i}.pkl", lambda p, s=obj.state_dict(): io.save_object(s, p)))
    grads = {}
    for i, model in enumerate(accelerator._models):
        grads.update({f"{i}.{name}": g for name, g in _gradients(model).items()})
    if grads:
        plan.append((f"{GRADIENTS_NAME}_{rank}.safetensors", lambda p, t=grads: io.save_tensors(t, p)))
    plan.append((f"{RNG_STATE_NAME}_{rank}.pkl", lambda p, s=_rng_payload(accelerator.step): io.save_object(s, p)))
    return plan


def _loader_files(accelerator, writer: bool) -> list:
    """Loader positions: gathered from every process, written once (as one state when all agree)."""
    plan = []
    for i, loader in enumerate(accelerator._dataloaders):
        states = _all_gather(accelerator.state, _loader_state(loader))
        if not writer or states[0] is None:
            continue
        payload = states[0] if all(s == states[0] for s in states) else {"hasten_per_process": states}
        plan.append((_numbered(SAMPLER_NAME, i, ".bin"), lambda p, s=payload: io.save_object(s, p)))
    return plan


# -- save_state -------------------------------------------------------------------------------------------------
def _target_for(accelerator, output_dir):
    config = accelerator.project_configuration
    if config.automatic_checkpoint_naming:
        return os.path.abspath(os.path.join(_checkpoints_root(config), f"checkpoint_{config.iteration}"))
    if output_dir is None:
        raise ConfigError(
            "save_state() needs an output_dir, or ProjectConfiguration(automatic_checkpoint_naming=True, "
            "project_dir=...) to name checkpoints itself"
        )
    return os.path.abspath(os.path.expanduser(str(output_dir)))


def _prepare_target(target: str, automatic: bool, token: str) -> str:
    parent = os.path.dirname(target)
    os.makedirs(parent, exist_ok=True)
    _recover(target)
    if automatic and os.path.exists(target):
        raise ConfigError(
            f"checkpoint {target} already exists; set accelerator.project_configuration.iteration past it, or "
            "call load_state() first (hasten then continues the numbering)"
        )
    _remove_stale_temps(parent)
    temp = _temp_for(target, token)
    os.makedirs(temp)
    return temp


def _temp_for(target: str, token: str) -> str:
    parent, name = os.path.split(target)
    return os.path.join(parent, f".{name}{io.TEMP_TAG}{token}")


def _commit(temp: str, target: str, files: dict, iteration, num_processes: int, rank: int) -> None:
    marker = {
        "format": io.MARKER_FORMAT, "version": 1, "complete": True, "iteration": iteration,
        "num_processes": num_processes, "created": time.time(), "files": files,
    }
    io.write_file(os.path.join(temp, io.MARKER_NAME), lambda p: io.save_json(marker, p), rank)
    io.fsync_dir(temp)
    parent = os.path.dirname(target)
    if not os.path.exists(target):
        os.rename(temp, target)
        io.fsync_dir(parent)
        io.crash_point(rank)
        return
    if _holds_only_a_checkpoint(target):
        # Replace a previous hasten checkpoint: move it aside, move the new one in, then delete the old one.
        # A crash between the two renames is repaired by `_recover` on the next save or load.
        old = os.path.join(parent, f".{os.path.basename(target)}{io.OLD_TAG}{os.path.basename(temp)[-12:]}")
        os.rename(target, old)
        io.crash_point(rank)
        os.rename(temp, target)
        io.fsync_dir(parent)
        io.crash_point(rank)
        io.remove_tree(old)
        return
    # A folder that holds other things too (logs, configs): mark it incomplete, move the files in one by one,
    # then mark it complete. A crash in between leaves it marked incomplete, never half-loaded.
    pending = dict(marker, complete=False)
    io.atomic_write(os.path.join(target, io.MARKER_NAME), lambda p: io.save_json(pending, p))
    for name in sorted(os.listdir(temp)):
        if name == io.MARKER_NAME:
            continue
        destination = os.path.join(target, name)
        if os.path.isdir(destination):
            io.remove_tree(destination)
        os.replace(os.path.join(temp, name), destination)
        io.crash_point(rank)
    io.fsync_dir(target)
    os.replace(os.path.join(temp, io.MARKER_NAME), os.path.join(target, io.MARKER_NAME))
    io.fsync_dir(target)
    io.remove_tree(temp)


def _holds_only_a_checkpoint(folder: str) -> bool:
    """True for an empty folder or a hasten checkpoint with nothing else in it: safe to replace whole."""
    entries = set(os.listdir(folder))
    if not entries:
        return True
    try:
        marker = io.read_marker(folder)
    except CheckpointError:
        return False
    if marker is None:
        return False
    listed = {name.split("/", 1)[0] for name in marker.get("files", {})} | {io.MARKER_NAME}
    return entries <= listed


def save_state(accelerator, output_dir=None, safe_serialization: bool = True, **save_model_func_kwargs) -> str:
    """Write every prepared object, RNG state and registered object to a checkpoint folder; return its path."""
    config = accelerator.project_configuration
    state = accelerator.state
    rank = accelerator.process_index
    writer = _writer(config, accelerator)
    target = _target_for(accelerator, output_dir)
    backend = accelerator._backend
    backend_writes = getattr(backend, "writes_own_checkpoint_files", False)

    # 1. The committing process(es) make the temporary folder; everybody learns whether that worked.
    token = _broadcast(state, uuid.uuid4().hex[:12])
    temp = _temp_for(target, token)
    problem = None
    if writer:
        try:
            _prepare_target(target, config.automatic_checkpoint_naming, token)
        except ConfigError as error:
            problem = error
        except OSError as error:
            problem = CheckpointError(f"cannot create checkpoint folder next to {target}: {error}")
    outcomes = _all_gather(state, None if problem is None else _describe(problem))
    if problem is not None:
        raise problem
    if any(o and o.startswith("ConfigError") for o in outcomes):  # the same error type on every process
        raise ConfigError(next(o for o in outcomes if o).split(": ", 1)[1])
    _raise_failures(outcomes, f"save_state({target})")

    # 2. State dicts are computed on every process (sharded backends gather them collectively), loader
    # positions are gathered, then 3. every process writes its files. Failures are collected so that no
    # process waits forever for another.
    models = list(accelerator._models)
    weights = [] if backend_writes else [backend.model_state_dict(m) for m in models]
    plan = _loader_files(accelerator, writer)
    written, problem = {}, None
    try:
        os.makedirs(temp, exist_ok=True)
        # Hooks get the temporary folder: whatever they write there (e.g. a model saved in its own format)
        # is committed with the rest, atomically.
        for hook in accelerator._save_model_state_pre_hook.values():
            hook(models, weights, temp)
        plan = _plan_files(accelerator, weights, models, safe_serialization, rank, writer, backend_writes) + plan
        if backend_writes:
            for name in backend.save_checkpoint_files(models, list(accelerator._optimizers), temp,
                                                      **save_model_func_kwargs):
                path = os.path.join(temp, name)
                io.fsync_tree(path) if os.path.isdir(path) else io.fsync_file(path)
                written.update(_sizes_under(temp, name))
        for name, write in plan:
            written[name] = io.write_file(os.path.join(temp, name), write, rank, sync=False)
        for name, _ in plan:  # one flush pass after all writes: durability before the commit is unchanged
            io.fsync_file(os.path.join(temp, name))
    except Exception as error:  # noqa: BLE001 - reported to every rank below
        problem = error
    reports = _all_gather(state, (None if problem is None else _describe(problem), sorted(written)))
    if any(error for error, _ in reports):
        if writer:
            io.remove_tree(temp)
        if problem is not None:
            raise CheckpointError(f"save_state({target}) failed on rank {rank}: {_describe(problem)}") from problem
        _raise_failures([error for error, _ in reports], f"save_state({target})")

    # 4. Commit, rotate, and let nobody return before the checkpoint exists. The marker lists every file in
    # the folder (on this machine's disk, with save_on_each_node), including any a hook wrote.
    problem = None
    if writer:
        try:
            reported = {name for _, names in reports for name in names}
            files = _sizes_under(temp, "")
            if set(files) - reported:
                io.fsync_tree(temp)
            io.fsync_dir(temp)
            io.crash_point(rank)
            _commit(temp, target, files, config.iteration, accelerator.num_processes, rank)
            if config.automatic_checkpoint_naming and config.total_limit is not None:
                _rotate(os.path.dirname(target), target, config.total_limit, rank)
        except Exception as error:  # noqa: BLE001
            problem = error
    outcomes = _all_gather(state, None if problem is None else _describe(problem))
    if problem is not None:
        raise CheckpointError(f"could not commit checkpoint {target}: {_describe(problem)}") from problem
    _raise_failures(outcomes, f"committing {target}")
    config.iteration += 1
    return target


def _sizes_under(folder: str, name: str) -> dict:
    """{path relative to folder: size} for a file, or for every file under a folder ("" = all of `folder`)."""
    path = os.path.join(folder, name) if name else folder
    if os.path.isfile(path):
        return {name: os.path.getsize(path)}
    sizes = {}
    for root, _dirs, files in os.walk(path):
        for file in files:
            full = os.path.join(root, file)
            sizes[os.path.relpath(full, folder)] = os.path.getsize(full)
    return sizes


# -- load_state -------------------------------------------------------------------------------------------------
def _map_location(accelerator, value):
    if value == "on_device":
        return accelerator.device
    if value in (None, "cpu"):
        return "cpu"
    raise TypeError(f"map_location must be None, 'cpu' or 'on_device', got {value!r}")


def _resolve_input(accelerator, input_dir) -> str:
    config = accelerator.project_configuration
    if input_dir is None:
        if not config.automatic_checkpoint_naming:
            raise ConfigError(
                "load_state() needs an input_dir, or ProjectConfiguration(automatic_checkpoint_naming=True) to "
                "pick the newest checkpoint itself"
            )
        root = _checkpoints_root(config)
        found = newest_checkpoint(root)
        if found is None:
            raise CheckpointError(f"no complete checkpoint in {root} to load")
        return found
    path = os.path.abspath(os.path.expanduser(str(input_dir)))
    if accelerator.is_main_process or (config.save_on_each_node and accelerator.is_local_main_process):
        _recover(path)
    accelerator.wait_for_everyone()
    if not os.path.isdir(path):
        raise ConfigError(f"load_state({input_dir!r}): {path} is not a directory")
    return path


_WRAPPER_PREFIXES = ("module.", "_orig_mod.")


def _bare_name(key: str) -> str:
    while key.startswith(_WRAPPER_PREFIXES):
        key = key.split(".", 1)[1]
    return key


def _match_wrapper_prefixes(model, state_dict: dict) -> dict:
    """Rename keys saved with other wrapper prefixes (`module.` from DDP, `_orig_mod.` from compile) than the
    model has now, so a checkpoint from 2 processes loads into 1 and back."""
    expected = model.state_dict().keys()
    if all(key in expected for key in state_dict):
        return state_dict
    by_bare = {_bare_name(key): key for key in expected}
    return {by_bare.get(_bare_name(key), key): value for key, value in state_dict.items()}


def _load_models(accelerator, models: list, folder: str, map_location, load_model_func_kwargs: dict) -> None:
    strict = load_model_func_kwargs.pop("strict", True)
    for i, model in enumerate(models):
        safe_path = os.path.join(folder, _numbered(SAFE_MODEL_NAME, i, ".safetensors"))
        bin_path = os.path.join(folder, _numbered(MODEL_NAME, i, ".bin"))
        if os.path.isfile(safe_path):
            state_dict = io.fill_aliases(model, io.load_tensors(safe_path, map_location))
        elif os.path.isfile(bin_path):
            state_dict = io.load_object(bin_path, map_location=map_location)
        else:
            raise CheckpointError(f"checkpoint file {safe_path} is missing (nor is there {os.path.basename(bin_path)})")
        state_dict = _match_wrapper_prefixes(model, state_dict)
        try:
            accelerator._backend.load_model_state_dict(model, state_dict, strict=strict)
        except RuntimeError as error:
            raise CheckpointError(f"cannot load {os.path.basename(safe_path)} into model {i}: {error}") from None


def _load_gradients(accelerator, folder: str) -> None:
    path = os.path.join(folder, f"{GRADIENTS_NAME}_{accelerator.process_index}.safetensors")
    if not os.path.isfile(path):
        return
    saved = io.load_tensors(path)
    for i, model in enumerate(accelerator._models):
        for name, param in model.named_parameters():
            grad = saved.get(f"{i}.{name}")
            if grad is None:
                continue
            if param.grad is not None and param.grad.shape == grad.shape:
                param.grad.copy_(grad)  # in place: DDP's gradient_as_bucket_view keeps .grad a bucket view
            else:
                param.grad = grad.to(device=param.device, dtype=param.dtype)


def _load_loaders(accelerator, folder: str, load_kwargs) -> None:
    for i, loader in enumerate(accelerator._dataloaders):
        path = os.path.join(folder, _numbered(SAMPLER_NAME, i, ".bin"))
        if not os.path.isfile(path) or not callable(getattr(loader, "load_state_dict", None)):
            continue  # Accelerate never writes this file; start the loader afresh
        payload = io.load_object(path, load_kwargs)
        if isinstance(payload, dict) and "hasten_per_process" in payload:
            per_process = payload["hasten_per_process"]
            payload = per_process[min(accelerator.process_index, len(per_process) - 1)]
        loader.load_state_dict(payload)


def _load_rng(accelerator, folder: str, load_kwargs) -> None:
    path = os.path.join(folder, f"{RNG_STATE_NAME}_{accelerator.process_index}.pkl")
    if not os.path.isfile(path):
        logger.warning("no %s: random states were not restored (resuming on more processes?)", path)
        return
    payload = io.load_object(path, load_kwargs)  # an unsafe file raises; anything else is only logged
    try:
        accelerator.step = int(payload.get("step", 0))
        _restore_rng(payload)
    except Exception as error:  # noqa: BLE001 - Accelerate logs this and goes on
        logger.warning("could not restore random states from %s: %s", path, error)


def _next_iteration(accelerator, folder: str, marker) -> None:
    """Continue automatic numbering after the loaded checkpoint and after every existing one (no collision)."""
    config = accelerator.project_configuration
    if not config.automatic_checkpoint_naming:
        return
    numbers = []
    if marker is not None and isinstance(marker.get("iteration"), int):
        numbers.append(marker["iteration"])
    elif _number_in(os.path.basename(folder)) is not None:
        numbers.append(_number_in(os.path.basename(folder)))
    numbers += [_number_in(os.path.basename(p)) for p in list_checkpoints(_checkpoints_root(config))]
    if numbers:
        config.iteration = max(config.iteration, max(numbers) + 1)


def load_state(accelerator, input_dir=None, load_kwargs=None, **load_model_func_kwargs) -> None:
    """Restore what `save_state` wrote (or an Accelerate checkpoint) into the prepared objects."""
    folder = _resolve_input(accelerator, input_dir)
    marker = io.read_marker(folder)
    if marker is not None:
        io.verify_files(folder, marker)
    map_location = _map_location(accelerator, load_model_func_kwargs.pop("map_location", None))
    load_kwargs = dict(load_kwargs or {})
    backend = accelerator._backend
    models = list(accelerator._models)
    for hook in accelerator._load_model_state_pre_hook.values():
        hook(models, folder)

    if getattr(backend, "writes_own_checkpoint_files", False):
        backend.load_checkpoint_files(models, list(accelerator._optimizers), folder, **load_model_func_kwargs)
    else:
        _load_models(accelerator, models, folder, map_location, load_model_func_kwargs)
        for i, opt in enumerate(accelerator._optimizers):
            state = io.load_object(os.path.join(folder, _numbered(OPTIMIZER_NAME, i, ".bin")), load_kwargs, map_location)
            model = models[i] if i < len(models) else (models[0] if models else None)
            backend.load_optimizer_state_dict(opt, state, model)
    for i, scheduler in enumerate(accelerator._schedulers):
        scheduler.load_state_dict(io.load_object(os.path.join(folder, _numbered(SCHEDULER_NAME, i, ".bin")), load_kwargs))
    _load_loaders(accelerator, folder, load_kwargs)
    scaler_path = os.path.join(folder, SCALER_NAME)
    if accelerator.scaler is not None and os.path.isfile(scaler_path):
        accelerator.scaler.load_state_dict(io.load_object(scaler_path, load_kwargs))
    _load_gradients(accelerator, folder)
    _load_rng(accelerator, folder, load_kwargs)

    custom_files = sorted((int(m.group(1)), n) for n in os.listdir(folder) if (m := CUSTOM_PATTERN.match(n)))
    if len(custom_files) != len(accelerator._custom_objects):
        raise CheckpointError(
            f"{folder} holds {len(custom_files)} custom_checkpoint_*.pkl file(s) but {len(accelerator._custom_objects)} "
            "object(s) are registered with register_for_checkpointing; register the same objects as when saving"
        )
    for index, obj in enumerate(accelerator._custom_objects):
        obj.load_state_dict(io.load_object(os.path.join(folder, f"custom_checkpoint_{index}.pkl"), load_kwargs))
    _next_iteration(accelerator, folder, marker)


# -- save_model -------------------------------------------------------------------------------------------------
def save_model(accelerator, model, save_directory, max_shard_size="10GB", safe_serialization: bool = True) -> None:
    """Write the unwrapped model's weights as (sharded) safetensors plus an index, the layout HF tools read."""
    save_directory = os.path.expanduser(str(save_directory))
    if os.path.isfile(save_directory):
        logger.error("save_model: %s should be a directory, not a file", save_directory)
        return
    max_bytes = io.parse_size(max_shard_size)
    state_dict = accelerator.get_state_dict(model)  # collective for sharded backends: every process calls it
    # None: a backend that gathers onto the main process only (DeepSpeed ZeRO-3) has nothing here to write,
    # but this process still joins the barrier below.
    if state_dict is not None:
        meta = [name for name, t in state_dict.items() if isinstance(t, torch.Tensor) and t.is_meta]
        if meta:
            raise RuntimeError(f"save_model: {len(meta)} tensor(s) are on the meta device (e.g. {meta[0]}); load weights first")
        if _writer(accelerator.project_configuration, accelerator):
            write_weights(state_dict, save_directory, max_bytes, safe_serialization)
    accelerator.wait_for_everyone()


def write_weights(state_dict: dict, save_directory: str, max_bytes: int, safe_serialization: bool = True) -> list:
    """Shard `state_dict` into `save_directory` (each file written atomically, the index last); return file names."""
    import json

    os.makedirs(save_directory, exist_ok=True)
    if safe_serialization:
        state_dict = io.drop_aliases(state_dict)
        prefix, ext, index_name = SAFE_MODEL_NAME, ".safetensors", "model.safetensors.index.json"
        write = io.save_tensors
    else:
        state_dict = {k: v for k, v in state_dict.items() if isinstance(v, torch.Tensor)}
        prefix, ext, index_name = MODEL_NAME, ".bin", "pytorch_model.bin.index.json"
        write = io.save_object
    shards = io.split_into_shards(state_dict, max_bytes)
    count = len(shards)
    names = [f"{prefix}{ext}"] if count == 1 else [f"{prefix}-{i + 1:05d}-of-{count:05d}{ext}" for i in range(count)]
    stale = re.compile(rf"^{re.escape(prefix)}-\d{{5}}-of-\d{{5}}{re.escape(ext)}$")
    for existing in os.listdir(save_directory):
        if (stale.match(existing) and existing not in names) or (count == 1 and existing == index_name):
            os.remove(os.path.join(save_directory, existing))
    for name, keys in zip(names, shards):
        io.atomic_write(os.path.join(save_directory, name), lambda p, k=keys: write({key: state_dict[key] for key in k}, p))
    if count > 1:
        index = {
            "metadata": {"total_size": sum(io.tensor_bytes(t) for t in state_dict.values())},
            "weight_map": {key: name for name, keys in zip(names, shards) for key in keys},
        }
        io.atomic_write(os.path.join(save_directory, index_name),
                        lambda p: _write_text(p, json.dumps(index, indent=2, sort_keys=True) + "\n"))
    return names


def _write_text(path: str, text: str) -> None:
    with open(path, "w") as handle:
        handle.write(text)


# Accelerate's standalone functions (`accelerate.checkpointing.save_accelerator_state`, ...) live in their own module.
from .checkpoint_functions import (  # noqa: E402,F401
    load_accelerator_state,
    load_custom_state,
    save_accelerator_state,
    save_custom_state,
)
