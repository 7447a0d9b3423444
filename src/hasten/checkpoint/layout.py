"""`save_state` / `load_state` / `save_model`: what goes into Accelerate's checkpoint layout, and in which order.

The facade hands over a `CheckpointContents`: every object to save or restore, built fresh for each call.
The backend writes and reads the model and optimizer files (`Backend.save_model_and_optimizer` /
`load_model_and_optimizer`); this module writes the rest (schedulers, scaler, loader positions, registered
objects, gradients of an unfinished accumulation window, RNG states) and leaves the folder's atomic commit,
recovery and rotation to `checkpoint/storage/folder.py`, and the files' bytes to `durable.py`, `fast_io.py` and `marker.py`. Collectives are
`distributed/operations.py`'s and RNG capture is `distributed/rng.py`'s. Loading runs no pickled code unless asked to.
"""

from __future__ import annotations

import logging
import os
import re
import uuid
from dataclasses import dataclass, field

import torch

from ..core.constants import DL_STATE_NAME, MODEL_NAME, SAFE_MODEL_NAME, SAMPLER_NAME, SCALER_NAME
from ..core.errors import CheckpointError, ConfigError, DiskFullError
from ..distributed import control
from ..distributed.rng import capture_rng_states, restore_rng_states
from . import async_save as background
from . import engine_checksums, files, state_dicts
from .storage import checksum, durable, fast_io, into_store, paths
from .storage import folder as folders
from .storage import marker as markers
from . import remote_checkpoints as remote

logger = logging.getLogger(__name__)

GRADIENTS_NAME = "gradients"  # hasten only: gradients accumulated so far, when saved mid-window

# Kept importable from here: callers look for checkpoint folders through this module.
list_checkpoints, newest_checkpoint = folders.list_checkpoints, folders.newest_checkpoint


@dataclass
class CheckpointContents:
    """Everything `save_state` writes and `load_state` restores, as the facade holds it at the time of the call.

    `state` answers who this process is (rank, number of processes, device); `project` names the folders
    (automatic naming, `total_limit`, `save_on_each_node`) and counts saves (`iteration`, advanced here).
    """

    backend: object
    state: object
    project: object
    models: list = field(default_factory=list)
    optimizers: list = field(default_factory=list)
    schedulers: list = field(default_factory=list)
    dataloaders: list = field(default_factory=list)
    custom_objects: list = field(default_factory=list)
    scaler: object = None
    step: int = 0
    save_hooks: list = field(default_factory=list)  # hook(models, weights, folder) before the weights are written
    load_hooks: list = field(default_factory=list)  # hook(models, folder) before anything is read
    # load_state moves a plain prepared loader to its saved position only when asked (automatic resume does);
    # as in Accelerate, a script's own load_state leaves it at the start, since such scripts skip by hand.
    # A use_stateful_dataloader loader is always restored (Accelerate does that too).
    loader_positions: bool = False

    @property
    def rank(self) -> int:
        return self.state.process_index

    @property
    def writer(self) -> bool:
        """Whether this process writes the files all processes share (one per machine with save_on_each_node)."""
        return self.state.is_local_main_process if self.project.save_on_each_node else self.state.is_main_process


# -- collectives (no-ops in one process) ------------------------------------------------------------------------
def _all_gather(value) -> list:
    """`value` from every process, in rank order (a control collective: the gloo group beside NCCL)."""
    return control.all_gather_objects(value)


def _broadcast(value):
    return control.broadcast_object(value)


def _raise_failures(results: list, what: str) -> None:
    """`results[rank]` is None or an error message; raise one error naming every failed rank."""
    failures = [f"rank {rank}: {message}" for rank, message in enumerate(results) if message]
    if failures:
        raise CheckpointError(f"{what} failed on {len(failures)} process(es): " + "; ".join(failures))


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


# -- what goes into a checkpoint --------------------------------------------------------------------------------
def _gradients(model) -> dict:
    """Gradients accumulated but not yet applied (a save in the middle of an accumulation window)."""
    return {_state_name(name): p.grad for name, p in model.named_parameters() if p.grad is not None}


def _window_open() -> bool:
    """Whether the save falls inside a gradient accumulation window (gradients summed but not yet applied)."""
    from ..state import GradientState

    return not GradientState().sync_gradients


def _state_name(name: str) -> str:
    # the name without activation checkpointing's wrapper, so a checkpoint loads with or without it
    return name.replace("_checkpoint_wrapped_module.", "")


def _loader_states(loader) -> dict:
    """{file stem: state} for one loader: hasten's position (`sampler`: epoch, shuffle, batches yielded) and, for
    a use_stateful_dataloader loader, torchdata's state (`dl_state_dict`, Accelerate's file)."""
    states = {}
    stateful = getattr(loader, "use_stateful_dataloader", False)
    position = getattr(loader, "_position_state", None)
    if callable(position):
        states[SAMPLER_NAME] = position()
    if stateful:
        states[DL_STATE_NAME] = loader.state_dict()
    elif SAMPLER_NAME not in states and callable(getattr(loader, "state_dict", None)):
        states[SAMPLER_NAME] = loader.state_dict()
    return states


def _plan_files(contents: CheckpointContents, stage=None) -> list:
    """(file name, write function) for everything this process writes besides the model and optimizer files.
    `stage(obj, name)` copies what a write will read, for a save that writes in the background."""
    plan = []
    if contents.writer:
        plan += files.scheduler_files(contents.schedulers, stage)
        if contents.scaler is not None:
            plan.append(files.scaler_file(contents.scaler, stage))
        plan += files.custom_object_files(contents.custom_objects, stage)
    grads = {}
    if _window_open():  # after a finished window the gradients were applied: nothing to carry over
        for i, model in enumerate(contents.models):
            grads.update({f"{i}.{name}": g for name, g in _gradients(model).items()})
    if grads:
        plan.append(files.tensors_file(f"{GRADIENTS_NAME}_{contents.rank}.safetensors", grads, stage))
    plan.append(files.rng_file(contents.rank, contents.step, capture_rng_states(), stage))
    return plan


def _loader_files(contents: CheckpointContents, stage=None) -> list:
    """Loader positions: gathered from every process, written once (as one state when all agree)."""
    plan = []
    for i, loader in enumerate(contents.dataloaders):
        gathered = _all_gather(_loader_states(loader))
        if not contents.writer:
            continue
        for stem in gathered[0]:
            states = [g.get(stem) for g in gathered]
            # A dispatcher's position is process 0's (the only one that reads the data).
            one = all(s == states[0] for s in states) or getattr(loader, "position_on_main_only", False)
            payload = states[0] if one else {"hasten_per_process": states}
            plan.append(files.object_file(files.loader_name(stem, i), payload, stage))
    return plan


# -- save_state -------------------------------------------------------------------------------------------------
def _target_for(project, output_dir):
    if project.automatic_checkpoint_naming:
        root = folders.checkpoints_root(project)
        if remote.is_remote(root):
            return remote.join(root, f"checkpoint_{project.iteration}")
        return os.path.abspath(os.path.join(root, f"checkpoint_{project.iteration}"))
    if output_dir is None:
        raise ConfigError(
            "save_state() needs an output_dir, or ProjectConfiguration(automatic_checkpoint_naming=True, "
            "project_dir=...) to name checkpoints itself"
        )
    if remote.is_remote(output_dir):
        return str(output_dir).rstrip("/")
    return os.path.abspath(os.path.expanduser(str(output_dir)))


def _make_temp(contents: CheckpointContents, target: str, automatic: bool) -> str:
    """Step 1 of a save: the writing process(es) make the temporary folder; everybody learns whether that worked."""
    token = _broadcast(uuid.uuid4().hex[:12])
    problem = None
    if contents.writer:
        try:
            folders.prepare_target(target, automatic, token)
        except ConfigError as error:
            problem = error
        except OSError as error:
            problem = CheckpointError(f"cannot create checkpoint folder next to {target}: {error}")
    outcomes = _all_gather(None if problem is None else _describe(problem))
    if problem is not None:
        raise problem
    if any(o and o.startswith("ConfigError") for o in outcomes):  # the same error type on every process
        raise ConfigError(next(o for o in outcomes if o).split(": ", 1)[1])
    _raise_failures(outcomes, f"save_state({target})")
    return folders.temp_for(target, token)


def _write_files(contents: CheckpointContents, temp: str, loader_plan: list, safe_serialization: bool,
                 save_model_func_kwargs) -> dict:
    """Step 3: the backend writes model and optimizer state (collectively where sharded), then every process
    writes its other files; {name: size} of what this process wrote. Raises what went wrong here."""
    models, run_hooks = _hooks_runner(contents, temp)
    paths.make_folder(temp)
    names = contents.backend.save_model_and_optimizer(
        temp, models, list(contents.optimizers), writer=contents.writer, rank=contents.rank,
        safe_serialization=safe_serialization, before_write=run_hooks, **save_model_func_kwargs,
    )
    plan = _plan_files(contents) + loader_plan
    written = {}
    for name, write in plan:
        written[name] = durable.write_file(os.path.join(temp, name), write, contents.rank, sync=False)
    # One flush pass after all writes: writing one file overlaps with the disk flushing the last.
    for name in list(names) + [name for name, _ in plan]:
        folders.make_durable(temp, name)
    for name in names:
        written.update(folders.sizes_under(temp, name))
    return written


@dataclass(frozen=True)
class _Commit:
    """What step 4 needs, fixed at the call (an asynchronous save commits after `save_state` returned)."""

    temp: str
    target: str
    writer: bool
    rank: int
    iteration: int
    num_processes: int
    total_limit: object  # None, or how many automatically named checkpoints to keep
    local_main: bool = True
    remote: object = None  # a remote_checkpoints.RemoteTarget when the checkpoint goes to object storage
    # every machine writes its own copy with save_on_each_node: library-written files then keep the size check only
    digest_engine_files: bool = True


def _commit_for(contents: CheckpointContents, temp: str, target: str, place=None) -> _Commit:
    project = contents.project
    limit = project.total_limit if project.automatic_checkpoint_naming else None
    return _Commit(temp, target, contents.writer, contents.rank, project.iteration, contents.state.num_processes, limit,
                   contents.state.is_local_main_process, place,
                   digest_engine_files=not (project.save_on_each_node and contents.state.use_distributed))


def _hooks_runner(contents: CheckpointContents, temp: str):
    models = list(contents.models)

    def run_hooks(weights):
        # Hooks get the temporary folder: whatever they write there (e.g. a model saved in its own format) is
        # committed with the rest, atomically.
        for hook in contents.save_hooks:
            hook(models, weights, temp)

    return models, run_hooks


def save_state(contents: CheckpointContents, output_dir=None, safe_serialization: bool = True,
               async_save: bool = False, **save_model_func_kwargs) -> str:
    """Write every object of `contents` to a checkpoint folder, atomically; return its path.

    With `async_save`, return once what changes outside the optimizer step is staged in CPU memory; the rest is
    copied, and the files written and committed, in the background (see `checkpoint/async_save.py`)."""
    background.wait()  # an earlier asynchronous save commits first, and raises here what went wrong in it
    contents.backend.check_save_kwargs(save_model_func_kwargs)  # same answer on every rank: nothing written yet
    project = contents.project
    target = _target_for(project, output_dir)
    if async_save and not contents.backend.supports_async_save:
        raise background.refuse(contents.backend)
    automatic = project.automatic_checkpoint_naming
    place = (remote.start_save(target, automatic, _broadcast, contents.rank, in_background=async_save)
             if remote.is_remote(target) else None)
    # a checkpoint for object storage gets a local folder under the staging root: hasten's writers stream into the
    # store through it, what others write there is uploaded at the commit
    temp = _make_temp(contents, place.local_target if place else target, automatic and place is None)
    if place is not None:  # hasten's files go straight into the store when its version prefix is open already
        remote.write_into_store(place, temp)
    if async_save:
        _save_in_background(contents, _commit_for(contents, temp, target, place), safe_serialization,
                            save_model_func_kwargs)
        project.iteration += 1
        return target

    # 2. Loader positions are gathered (a collective, so before anything that may fail on one process only),
    # then 3. every process writes its files. Failures are collected so that no process waits for another.
    loader_plan = _loader_files(contents)
    written, problem = {}, None
    try:
        written = _write_files(contents, temp, loader_plan, safe_serialization, save_model_func_kwargs)
    except Exception as error:  # noqa: BLE001 - reported to every rank below
        problem = error
    _finish(_commit_for(contents, temp, target, place), problem, written, _all_gather)
    project.iteration += 1
    return target


def _finish(commit: _Commit, problem, written: dict, gather) -> None:
    """Steps 3b and 4, on every process: agree (through `gather`) that every process wrote its files, then the
    writer commits and rotates, and nobody returns before the checkpoint exists. Raises what failed anywhere."""
    target, temp = commit.target, commit.temp
    sums = checksum.take(temp)  # the checksums of the files this process wrote, for the marker
    stored = into_store.stop_writing_into(temp)  # files this process wrote straight into the store
    written = {**written, **{name: size for name, (size, _) in stored.items()}}
    sums.update({name: {**spec, into_store.STORED: size} for name, (size, spec) in stored.items()})
    reports = gather((None if problem is None else _describe(problem), sorted(written), sums))
    if any(error for error, _, _ in reports):
        needed = folders.bytes_needed(temp, target) if _disk_full(problem, reports) else None
        if commit.writer:
            durable.remove_tree(temp)
        if commit.remote is not None:
            remote.abandon(commit.remote, commit.rank)
        gather(None)  # nobody returns before the half-written folder is gone
        if needed is not None:  # say what the whole save needs, and that nothing was lost
            _raise_disk_full(target, temp, problem, reports, needed)
        uploads = [f"rank {r}: {error.split(': ', 1)[1]}" for r, (error, _, _) in enumerate(reports)
                   if error and error.startswith("CheckpointError: upload of ")]
        if commit.remote is not None and uploads:  # a DCP folder streamed into the store: the same line everywhere
            more = f" (and {len(uploads) - 1} more process(es))" if len(uploads) > 1 else ""
            raise CheckpointError(f"save_state({target}) failed while writing into the store: {uploads[0]}{more}; "
                                  "nothing was committed and the previous checkpoint is intact")
        if problem is not None:
            raise CheckpointError(f"save_state({target}) failed on rank {commit.rank}: {_describe(problem)}") from problem
        _raise_failures([error for error, _, _ in reports], f"save_state({target})")
    if commit.digest_engine_files:  # 3c. what torch's DCP or DeepSpeed wrote gets checksums too
        reports = engine_checksums.digest_after_write(temp, reports, gather, commit.rank)
    if commit.remote is not None:  # object storage: upload, then rank 0 writes the manifest
        remote.publish(commit.remote, temp, reports, gather, rank=commit.rank, writer=commit.writer,
                       local_main=commit.local_main, iteration=commit.iteration, num_processes=commit.num_processes,
                       total_limit=commit.total_limit, describe=_describe)
        return

    # 4. Commit, rotate. The marker lists every file in the folder (on this machine's disk, with
    # save_on_each_node), including any a hook wrote.
    problem = None
    if commit.writer:
        try:
            reported = {name for _, names, _ in reports for name in names}
            files = folders.sizes_under(temp, "")
            if set(files) - reported:
                durable.fsync_tree(temp)
            durable.fsync_dir(temp)
            durable.crash_point(commit.rank)
            checksums = {name: spec for _, _, specs in reports for name, spec in specs.items() if name in files}
            folders.commit(temp, target, files, commit.iteration, commit.num_processes, commit.rank, checksums)
            if commit.total_limit is not None:
                folders.rotate(os.path.dirname(target), target, commit.total_limit, commit.rank)
        except Exception as error:  # noqa: BLE001
            problem = error
            if isinstance(error, DiskFullError):  # the marker did not fit: nothing was renamed yet
                durable.remove_tree(temp)
    outcomes = gather(None if problem is None else _describe(problem))
    full = [o.split(": ", 1)[1] for o in outcomes if o and o.startswith(DiskFullError.__name__)]
    if full:  # on every rank alike
        raise DiskFullError(f"could not commit checkpoint {target}: {full[0].replace(temp, target)}; free some space "
                            "and save again; the half-written checkpoint was removed and the previous one is intact")
    if problem is not None:
        raise CheckpointError(f"could not commit checkpoint {target}: {_describe(problem)}") from problem
    _raise_failures(outcomes, f"committing {target}")


def _disk_full(problem, reports) -> bool:
    return isinstance(problem, DiskFullError) or any(
        error and error.startswith(DiskFullError.__name__) for error, _, _ in reports)


def _raise_disk_full(target: str, temp: str, problem, reports, needed: int):
    # the files are named where they would have been (the temporary folder is gone)
    where = [f"rank {r}: {error.split(': ', 1)[1].replace(temp, target)}" for r, (error, _, _) in enumerate(reports)
             if error and error.startswith(DiskFullError.__name__)]
    raise DiskFullError(
        f"save_state({target}) ran out of disk space ({'; '.join(where)}); the checkpoint needs about {needed} bytes: "
        "free that much space (or lower ProjectConfiguration(total_limit=...), or save elsewhere) and save again; "
        "the half-written checkpoint was removed and the previous one is intact"
    ) from problem


def _live_storages(contents: CheckpointContents) -> frozenset:
    """Storage addresses of the CPU tensors only an optimizer step changes: the prepared models' parameters and
    the prepared optimizers' state. The writer thread copies those (hasten's optimizer step waits for it)."""
    tensors = [p for model in contents.models for p in model.parameters()]
    for optimizer in contents.optimizers:
        for state in getattr(optimizer, "state", {}).values():
            if isinstance(state, dict):
                tensors += [t for t in state.values() if isinstance(t, torch.Tensor)]
    # Plain tensors only: a DTensor's or a quantized subclass's storage is not what its state dict holds.
    return frozenset(t.untyped_storage().data_ptr() for t in tensors
                     if type(t) in (torch.Tensor, torch.nn.Parameter) and t.device.type == "cpu" and t.numel())


def _save_in_background(contents: CheckpointContents, commit: _Commit, safe_serialization: bool,
                        save_model_func_kwargs: dict) -> None:
    """Stage everything that changes outside the optimizer step now, note the rest; the background thread
    copies the rest, then writes, agrees and commits."""
    stager = background.stager
    stager.begin(_live_storages(contents))
    loader_plan = _loader_files(contents, stager)  # a collective: outside what may fail on one process only
    models, run_hooks = _hooks_runner(contents, commit.temp)
    jobs, problem = [], None
    try:
        paths.make_folder(commit.temp)
        jobs = contents.backend.stage_model_and_optimizer(
            commit.temp, models, list(contents.optimizers), writer=contents.writer, rank=contents.rank,
            safe_serialization=safe_serialization, before_write=run_hooks, stage=stager,
            dcp_group=background.dcp_groups(), **save_model_func_kwargs,
        )
        jobs = jobs + _plan_files(contents, stager) + loader_plan
    except Exception as error:  # noqa: BLE001 - reported to every rank by the background agreement
        problem = error
    finally:
        staged = stager.end()

    def finish(write_problem, written, gather):
        _finish(commit, problem or write_problem, written, gather)

    background.start(commit.temp, jobs, contents.rank, finish, staged)


# -- load_state -------------------------------------------------------------------------------------------------
def _resolve_input(contents: CheckpointContents, input_dir) -> str:
    project = contents.project
    if input_dir is None:
        if not project.automatic_checkpoint_naming:
            raise ConfigError(
                "load_state() needs an input_dir, or ProjectConfiguration(automatic_checkpoint_naming=True) to "
                "pick the newest checkpoint itself"
            )
        root = folders.checkpoints_root(project)
        if remote.is_remote(root):
            found = (remote.committed_under(root) or [None])[-1]
            if found is None and not getattr(project, "automatic_resume", False):
                raise FileNotFoundError(f"load_state(): no committed checkpoint under {root} yet; set "
                                        "ProjectConfiguration(automatic_resume=True) to start from the beginning when "
                                        "there is no checkpoint yet")
            return None if found is None else _fetch(contents, found)
        found = folders.newest_checkpoint(root)
        if found is None and folders.list_checkpoints(root):  # folders there, none whole: refuse to start over
            raise CheckpointError(f"no complete checkpoint in {root} to load (each one is damaged; see the warnings)")
        if found is None:
            if not getattr(project, "automatic_resume", False):  # Accelerate's errors, in its cases
                fix = ("; set ProjectConfiguration(automatic_resume=True) to start from the beginning when there is "
                       "no checkpoint yet")
                if not paths.is_dir(root):
                    raise FileNotFoundError(f"load_state(): {root} does not exist: no checkpoint was saved yet{fix}")
                raise IndexError(f"load_state(): no checkpoint in {root} yet{fix}")
            # automatic_resume (a hasten setting): a fresh project has nothing to resume; see docs/fault_tolerance.md
            logger.info("load_state(): no checkpoint in %s yet; starting from the beginning", root)
        return found
    if remote.is_remote(input_dir):
        return _fetch(contents, str(input_dir).rstrip("/"))
    path = os.path.abspath(os.path.expanduser(str(input_dir)))
    if contents.writer:
        folders.recover(path)
    contents.state.wait_for_everyone()
    if not paths.is_dir(path):
        raise ConfigError(f"load_state({input_dir!r}): {path} is not a directory")
    return path


def _fetch(contents: CheckpointContents, url: str) -> str:
    """A committed checkpoint in object storage, downloaded to a local folder with a complete marker."""
    return remote.fetch(url, contents.state.is_local_main_process)


def _load_gradients(contents: CheckpointContents, folder: str) -> None:
    path = os.path.join(folder, f"{GRADIENTS_NAME}_{contents.rank}.safetensors")
    if not paths.is_file(path):
        return
    saved = fast_io.load_tensors(path)
    for i, model in enumerate(contents.models):
        for name, param in model.named_parameters():
            grad = saved.get(f"{i}.{_state_name(name)}")
            if grad is None:
                continue
            if param.grad is not None and param.grad.shape == grad.shape:
                param.grad.copy_(grad)  # in place: DDP's gradient_as_bucket_view keeps .grad a bucket view
            else:
                param.grad = grad.to(device=param.device, dtype=param.dtype)


def _read_loader_file(contents: CheckpointContents, folder: str, name: str, load_kwargs):
    # None when not saved (an Accelerate checkpoint of a plain loader): the loader starts afresh
    payload = files.read_if_present(folder, name, load_kwargs)
    if isinstance(payload, dict) and "hasten_per_process" in payload:
        per_process = payload["hasten_per_process"]
        payload = per_process[min(contents.rank, len(per_process) - 1)]
    return payload


def _saved_world(folder: str, marker):
    """How many processes wrote the checkpoint: the marker's count, or (Accelerate's, no marker) its RNG files'."""
    if marker is not None and isinstance(marker.get("num_processes"), int):
        return marker["num_processes"]
    ranks = files.ranks_with_rng(folder)
    return max(ranks) + 1 if ranks else None


def _world_changed(contents: CheckpointContents, folder: str, marker) -> bool:
    """A checkpoint saved by another number of processes loads as in Accelerate (weights and optimizer whole, the
    random states of the ranks that have a file), with one warning saying what does not carry over: the loaders'
    positions belong to the old sharding of the data, so the loaders start their epoch from its first batch. Under
    the `strict` setting it is refused in one line."""
    from ..config.resolve import strict

    saved, now = _saved_world(folder, marker), contents.state.num_processes
    if saved is None or saved == now:
        return False
    ranks = f"rank {saved} has" if now == saved + 1 else f"ranks {saved}-{now - 1} have"
    missing = f"; {ranks} no random states saved (torch's stay as they are)" if now > saved else ""
    what = (f"load_state({folder}): the checkpoint was saved by {saved} process(es) and is loaded by {now}: the "
            f"weights and optimizer load whole, but the data loaders' positions belong to {saved} shards, so each "
            f"loader starts its epoch from the first batch{missing}")
    if strict():
        raise ConfigError(f"{what}; the strict setting refuses this: load it with {saved} process(es), or turn strict off")
    if contents.state.is_main_process:  # the same line from every process would say nothing more
        logger.warning(what)
    return True


def _load_loaders(contents: CheckpointContents, folder: str, load_kwargs, world_changed: bool = False) -> None:
    """Without `contents.loader_positions`, a plain loader goes back to the saved epoch and shuffle but starts
    it from its first batch (Accelerate leaves the position alone; scripts skip the done batches by hand). A
    use_stateful_dataloader loader continues where torchdata's state says (Accelerate does the same)."""
    if world_changed:  # see `_world_changed`: the positions belong to another sharding of the data
        return
    for i, loader in enumerate(contents.dataloaders):
        stateful = getattr(loader, "use_stateful_dataloader", False)
        position = _read_loader_file(contents, folder, files.loader_name(SAMPLER_NAME, i), load_kwargs)
        if position is not None:
            if callable(getattr(loader, "_load_position", None)):
                loader._load_position(position, within_epoch=contents.loader_positions and not stateful)
            elif contents.loader_positions and not stateful and callable(getattr(loader, "load_state_dict", None)):
                loader.load_state_dict(position)
        if stateful:
            state = _read_loader_file(contents, folder, files.loader_name(DL_STATE_NAME, i), load_kwargs)
            if state is not None:
                loader.load_state_dict(state)


def _load_rng(contents: CheckpointContents, folder: str, load_kwargs, world_changed: bool = False):
    """Restore this process's random states; returns the saved step counter (None when there is none)."""
    path = os.path.join(folder, files.rng_name(contents.rank))
    if not paths.is_file(path):
        if not world_changed:  # else `_world_changed` said it already, in its one line
            logger.warning("no %s: random states were not restored", path)
        return _step_of_another_rank(folder, load_kwargs)
    payload = fast_io.load_object(path, load_kwargs)
    # Accelerate logs any error here and resumes with the wrong random state; hasten stops (docs/differences.md).
    try:
        step = int(payload.get("step", 0))
        restore_rng_states(payload)
    except (AttributeError, KeyError, TypeError, ValueError, RuntimeError) as error:
        raise CheckpointError(f"could not restore random states from {path}: {error} (the file is damaged or "
                              "not a random-state file; save the checkpoint again)") from error
    return step


def _step_of_another_rank(folder: str, load_kwargs):
    """The step counter every rank saved (the same number in each RNG file), read from the lowest-numbered
    file there is, so that a rank without its own file syncs on the same micro-steps as the others; None
    (the counter stays as it is, on every rank alike) when the folder has no RNG file at all."""
    ranks = files.ranks_with_rng(folder)
    if not ranks:
        return None
    payload = files.read(folder, files.rng_name(ranks[0]), load_kwargs)
    return int(payload.get("step", 0)) if isinstance(payload, dict) else None


def _next_iteration(project, folder: str, marker) -> None:
    """Continue automatic numbering after the loaded checkpoint and after every existing one (no collision)."""
    if not project.automatic_checkpoint_naming:
        return
    numbers = []
    if marker is not None and isinstance(marker.get("iteration"), int):
        numbers.append(marker["iteration"])
    elif folders.number_in(os.path.basename(folder)) is not None:
        numbers.append(folders.number_in(os.path.basename(folder)))
    root = folders.checkpoints_root(project)
    existing = remote.committed_under(root) if remote.is_remote(root) else folders.list_checkpoints(root)
    numbers += [folders.number_in(p.rstrip("/").rsplit("/", 1)[-1]) for p in existing]
    if numbers:
        project.iteration = max(project.iteration, max(numbers) + 1)


def load_state(contents: CheckpointContents, input_dir=None, load_kwargs=None, **load_model_func_kwargs):
    """Restore what `save_state` wrote (or an Accelerate checkpoint) into the objects of `contents`.

    Returns the step counter saved with this process's random states (None if the file is missing), which
    the facade takes over."""
    background.wait()  # a save still being written commits first (it may be the checkpoint to load)
    folder = _resolve_input(contents, input_dir)
    if folder is None:
        return None
    try:
        marker = markers.read_marker(folder)
        if marker is not None:
            markers.verify_files(folder, marker)
            if not folder.startswith(remote.staging_root()):  # a download was verified as it came in
                engine_checksums.verify_before_read(folder, marker, _all_gather, contents.rank)
        # Every file read below is checked against the checksums written with it, as its bytes come in.
        with fast_io.expect_checksums(folder, (marker or {}).get("checksums")):
            return _load_from(contents, folder, marker, load_kwargs, load_model_func_kwargs)
    finally:
        if folder.startswith(remote.staging_root()):  # a downloaded copy of a remote checkpoint
            contents.state.wait_for_everyone()
            remote.release(folder, contents.state.is_local_main_process)


def _load_from(contents: CheckpointContents, folder: str, marker, load_kwargs, load_model_func_kwargs):
    world_changed = _world_changed(contents, folder, marker)  # before anything loads: strict refuses it whole
    map_location = files.resolve_map_location(load_model_func_kwargs.pop("map_location", None),
                                             lambda: contents.state.device)
    load_kwargs = dict(load_kwargs or {})
    models = list(contents.models)
    for hook in contents.load_hooks:
        hook(models, folder)  # a hook may remove the models it loads itself

    contents.backend.load_model_and_optimizer(
        folder, models, list(contents.optimizers), map_location=map_location, load_kwargs=load_kwargs,
        **load_model_func_kwargs,
    )
    for i, scheduler in enumerate(contents.schedulers):
        scheduler.load_state_dict(files.read(folder, files.scheduler_name(i), load_kwargs))
    _load_loaders(contents, folder, load_kwargs, world_changed)
    if contents.scaler is not None and paths.is_file(os.path.join(folder, SCALER_NAME)):
        contents.scaler.load_state_dict(files.read(folder, SCALER_NAME, load_kwargs))
    _load_gradients(contents, folder)
    step = _load_rng(contents, folder, load_kwargs, world_changed)

    custom_files = files.custom_files(folder)
    if len(custom_files) != len(contents.custom_objects):
        raise CheckpointError(
            f"{folder} holds {len(custom_files)} custom_checkpoint_*.pkl file(s) but {len(contents.custom_objects)} "
            "object(s) are registered with register_for_checkpointing; register the same objects as when saving"
        )
    custom_kwargs = _custom_load_kwargs(load_kwargs)
    for index, obj in enumerate(contents.custom_objects):
        obj.load_state_dict(files.read(folder, files.custom_name(index), custom_kwargs))
    _next_iteration(contents.project, folder, marker)
    return step


def _custom_load_kwargs(load_kwargs: dict) -> dict:
    """How `load_state` reads `custom_checkpoint_*.pkl`: as Accelerate, with `weights_only=False` and without the
    caller's load_kwargs (a registered object's state may hold any Python object); under hasten's `strict`
    setting, safely like every other file (`load_kwargs={"weights_only": False}` opts in)."""
    from ..config.resolve import strict

    return load_kwargs if strict() else {"weights_only": False}


# -- save_model -------------------------------------------------------------------------------------------------
def save_model(contents: CheckpointContents, model, save_directory, max_shard_size="10GB",
               safe_serialization: bool = True) -> None:
    """Write the unwrapped model's weights as (sharded) safetensors plus an index, the layout HF tools read."""
    to_store = remote.is_remote(save_directory)
    save_directory = str(save_directory).rstrip("/") if to_store else os.path.expanduser(str(save_directory))
    if not to_store and paths.is_file(save_directory):
        logger.error("save_model: %s should be a directory, not a file", save_directory)
        return
    max_bytes = state_dicts.parse_size(max_shard_size)
    state_dict = contents.backend.full_state_dict(model, unwrap=True)  # collective for sharded backends
    if contents.project.save_on_each_node and contents.state.use_distributed:
        state_dict = _whole_on_every_writer(contents, state_dict)
    # None: a backend that gathers onto the main process only (DeepSpeed ZeRO-3) has nothing here to write,
    # but this process still joins the barrier below.
    if state_dict is not None:
        meta = [name for name, t in state_dict.items() if isinstance(t, torch.Tensor) and t.is_meta]
        if meta:
            raise RuntimeError(f"save_model: {len(meta)} tensor(s) are on the meta device (e.g. {meta[0]}); load weights first")
        if contents.writer and to_store:  # written locally under the staging root, then uploaded, the index last
            remote.save_directory(save_directory, lambda local: write_weights(state_dict, local, max_bytes,
                                                                              safe_serialization))
        elif contents.writer:
            write_weights(state_dict, save_directory, max_bytes, safe_serialization)
    contents.state.wait_for_everyone()


def _whole_on_every_writer(contents: CheckpointContents, state_dict):
    """With `save_on_each_node`, every machine's writer needs the whole model; sharded backends gather it onto
    rank 0 only (`{}` or None elsewhere), which wrote an empty `model.safetensors` (and removed the old shards) on
    every other machine. Rank 0's tensors are broadcast, one at a time, on the data plane; writers keep a CPU copy.
    Tensors sharing storage on rank 0 stay shared, so every machine drops the same aliases."""
    import torch.distributed as dist

    state = contents.state
    counts = control.all_gather_objects(len(state_dict or {}))
    needy = [rank for rank, count in enumerate(counts) if count == 0]
    if counts[0] == 0 or not needy:
        return state_dict
    plan = None
    if state.process_index == 0:
        first_of: dict = {}
        plan = []
        for name, value in state_dict.items():
            if isinstance(value, torch.Tensor):
                key = (value.untyped_storage().data_ptr(), value.storage_offset(), tuple(value.shape), value.dtype)
                plan.append((name, tuple(value.shape), value.dtype, first_of.setdefault(key, name)))
            else:
                plan.append((name, None, value, None))
    plan = control.broadcast_object(plan)
    keep = contents.writer and state.process_index in needy
    received = {}
    for name, shape, dtype, alias in plan:
        if shape is None:  # not a tensor: carried in the plan itself
            received[name] = dtype
            continue
        if alias != name:
            received[name] = received.get(alias)
            continue
        if state.process_index == 0:
            tensor = state_dict[name].detach().to(state.device)
        else:
            tensor = torch.empty(shape, dtype=dtype, device=state.device)
        dist.broadcast(tensor, src=0)
        if keep:
            received[name] = tensor.cpu()
    return received if keep else state_dict


def write_weights(state_dict: dict, save_directory: str, max_bytes: int, safe_serialization: bool = True) -> list:
    """Shard `state_dict` into `save_directory` (each file written atomically, the index last); return file names."""
    import json

    paths.make_folder(save_directory)
    if safe_serialization:
        state_dict = state_dicts.drop_aliases(state_dict)
        prefix, ext, index_name = SAFE_MODEL_NAME, ".safetensors", "model.safetensors.index.json"
        write = fast_io.save_tensors
    else:
        state_dict = {k: v for k, v in state_dict.items() if isinstance(v, torch.Tensor)}
        prefix, ext, index_name = MODEL_NAME, ".bin", "pytorch_model.bin.index.json"
        write = durable.save_object
    shards = state_dicts.split_into_shards(state_dict, max_bytes)
    count = len(shards)
    names = [f"{prefix}{ext}"] if count == 1 else [f"{prefix}-{i + 1:05d}-of-{count:05d}{ext}" for i in range(count)]
    stale = re.compile(rf"^{re.escape(prefix)}-\d{{5}}-of-\d{{5}}{re.escape(ext)}$")
    for existing in paths.names_in(save_directory):
        if (stale.match(existing) and existing not in names) or (count == 1 and existing == index_name):
            paths.remove_file(os.path.join(save_directory, existing))
    for name, keys in zip(names, shards):
        durable.atomic_write(os.path.join(save_directory, name), lambda p, k=keys: write({key: state_dict[key] for key in k}, p))
    if count > 1:
        index = {
            "metadata": {"total_size": sum(state_dicts.tensor_bytes(t) for t in state_dict.values())},
            "weight_map": {key: name for name, keys in zip(names, shards) for key in keys},
        }
        durable.atomic_write(os.path.join(save_directory, index_name),
                        lambda p: paths.write_text(p, json.dumps(index, indent=2, sort_keys=True) + "\n"))
    return names
