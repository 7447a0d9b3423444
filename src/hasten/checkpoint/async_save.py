"""Asynchronous `save_state(..., async_save=True)` (a hasten extension): stage, then write, behind training.

What the call copies, and what it leaves to the writer thread. Parameters of the prepared models and the
state tensors of the prepared optimizers (CPU tensors; found by their storage) change only in the optimizer
step, so the call only notes them (an alias and its `_version`) and the background writer thread copies them
into the reused CPU buffers first, then sets the *staged* event; hasten's optimizer `step()` waits for that
event before it changes anything. Everything else (buffers such as BatchNorm running statistics, which a
forward changes; gradients; schedulers, RNG states, loader positions, registered objects) is small and is
copied in the call. Device (CUDA) tensors are copied in the call too, without blocking, into pinned buffers;
the writer waits on CUDA events recorded after those copies (the stream's order keeps the next step's
kernels behind them). After copying a noted tensor the writer compares its `_version` with the one at the
call: a change in place in between (a weight changed outside `optimizer.step()`) fails the save with a
one-line error instead of writing a torn copy. A change through `.data` bypasses the version counter and
cannot be seen. Once staged, the thread writes the files, the ranks agree that all of them finished and the
main process commits the folder (marker last) and rotates old ones, exactly as a synchronous save does.
Sharded state (FSDP) goes through torch.distributed.checkpoint's `async_save`.

Collectives. The training loop owns the default process group, so nothing in the background may use it:
the writer thread and each DCP upload get a gloo group of their own, created (collectively, from the main
thread) at the first asynchronous save and kept for the run. Because every rank's writer thread reaches the
agreement whatever happened on it, a failure on one rank never leaves another waiting.

One save is in flight per process. `wait()` joins it and raises what went wrong in it; it runs at the start of
every `save_state` and `load_state`, in `wait_for_checkpoint()` and `end_training()` (points every rank
reaches together, so all ranks raise the same error at the same call). At interpreter exit Python joins the
writer thread (it is not a daemon), and an error nobody collected is printed.

Test-only hooks. With `HASTEN_TEST_ASYNC_WRITE_GATE=<path>` the writer thread, once it has staged, waits until
a file exists at `<path>` before it writes anything (DCP uploads are not held), so a test can change the
parameters while the write is pending and see that the staged copy is what lands on disk;
`HASTEN_TEST_ASYNC_STAGE_GATE=<path>` holds it the same way before it copies the parameters and optimizer
state (an optimizer step then waits), so a test can change a weight in place in between. The crash points
of `durable.py` (`HASTEN_TEST_CRASH_AT`) fire in the writer thread too, killing the process in the middle
of a background write. Never set any of them in production.
"""

from __future__ import annotations

import atexit
import copy
import os
import sys
import threading
import time

import torch

from ..core.errors import CheckpointError, ConfigError
from .storage import durable
from .storage import folder as folders
from .storage import paths

GATE_ENV = "HASTEN_TEST_ASYNC_WRITE_GATE"  # test-only, see the module docstring
STAGE_GATE_ENV = "HASTEN_TEST_ASYNC_STAGE_GATE"  # test-only, see the module docstring

_lock = threading.Lock()
_pending: threading.Thread | None = None
_failure: BaseException | None = None
_groups: list = []  # gloo groups for the background: [0] the writer thread's agreement, [1:] DCP uploads
_groups_world: list = [None]  # the default group they were made under (a new process group needs new ones)

# Set while the writer thread still copies parameters / optimizer state (the optimizer step waits on it):
# read on the hot path, so a plain module attribute that is None when nothing is staging.
staging: threading.Event | None = None
waited_for_staging = [0.0]  # seconds optimizer steps spent waiting for staging, in total (benchmarks read it)


# -- staging: a private CPU copy of everything a save writes ---------------------------------------------------
_IMMUTABLE = (str, bytes, int, float, complex, bool, type(None), torch.dtype, torch.device, torch.Size)


class Stager:
    """Deep-copies nested state (dicts, lists, tuples, tensors, other objects) into CPU memory.

    Tensors land in buffers kept from the previous save when shape and dtype match (keyed by their place in
    the state), so a run's later saves copy into memory already touched instead of faulting in fresh pages.
    Tensors that share storage in the source (tied weights) share it in the copy, so the writer still sees
    them as aliases. CPU tensors whose storage is among `live` (given to `begin`) get their buffer now but
    are copied later, by `Staged.finish()` in the writer thread; `end()` hands that remaining work over."""

    def __init__(self):
        self._buffers: dict = {}
        self._fresh: dict = {}
        self._aliases: dict = {}
        self._live: frozenset = frozenset()
        self._deferred: list = []
        self._devices: set = set()  # CUDA devices copied from without blocking

    def begin(self, live: frozenset = frozenset()) -> None:
        """Start a save; `live`: storage addresses of CPU tensors that only the optimizer step changes."""
        self._fresh, self._aliases, self._live, self._deferred, self._devices = {}, {}, live, [], set()

    def end(self) -> Staged:
        """Keep this save's buffers for the next one (and drop the ones it no longer uses); return what the
        writer thread must still do before it reads them."""
        events = []
        for device in self._devices:  # non-blocking device-to-host copies: the writer waits, not the call
            with torch.cuda.device(device):
                events.append(torch.cuda.Event())
                events[-1].record()  # on that device's current stream, behind the copies
        staged = Staged(self._deferred, events)
        self._buffers, self._fresh, self._aliases, self._live, self._deferred = self._fresh, {}, {}, frozenset(), []
        return staged

    def release(self) -> None:
        self._buffers, self._fresh, self._aliases, self._deferred = {}, {}, {}, []

    def __call__(self, obj, key: str = ""):
        if isinstance(obj, _IMMUTABLE):
            return obj
        if type(obj) is torch.Tensor:
            return self._tensor(obj, key)
        if type(obj) is dict:
            return {k: self(v, f"{key}/{k}") for k, v in obj.items()}
        if type(obj) in (list, tuple):
            return type(obj)(self(v, f"{key}/{i}") for i, v in enumerate(obj))
        return copy.deepcopy(obj)  # Parameters, DTensors, numpy arrays, user objects: a copy all the same

    def _tensor(self, tensor: torch.Tensor, key: str) -> torch.Tensor:
        tensor = tensor.detach()  # shares the source's version counter
        if tensor.layout != torch.strided or tensor.is_meta:
            return copy.deepcopy(tensor)
        storage = tensor.untyped_storage().data_ptr()
        alias = (storage, tensor.device, tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()),
                 tensor.dtype) if tensor.numel() else None
        if alias is not None and alias in self._aliases:
            return self._aliases[alias]
        buffer = self._buffers.get(key)
        on_device = tensor.device.type == "cuda"
        if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype or key in self._fresh:
            buffer = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=on_device)
        if alias is not None and tensor.device.type == "cpu" and storage in self._live:
            self._deferred.append((key, tensor, tensor._version, buffer))
        else:
            buffer.copy_(tensor, non_blocking=on_device)
            if on_device:
                self._devices.add(tensor.device)
        self._fresh[key] = buffer
        if alias is not None:
            self._aliases[alias] = buffer
        return buffer


class Staged:
    """What is left of staging after the call: the deferred copies of live tensors, and the CUDA events after
    the call's device-to-host copies (one per device). `finish()` runs in the writer thread before anything
    is written."""

    def __init__(self, deferred: list, events: list = ()):
        self.deferred, self.events = deferred, list(events)

    def finish(self) -> None:
        for event in self.events:
            event.synchronize()
        for key, source, version, buffer in self.deferred:
            buffer.copy_(source)
            _check_unchanged(key, source, version)
        for key, source, version, _ in self.deferred:  # again: a change that overlapped a copy bumps it late
            _check_unchanged(key, source, version)
        self.deferred = []


def _check_unchanged(key: str, source: torch.Tensor, version: int) -> None:
    if source._version != version:
        file, _, name = key.partition("/")
        raise CheckpointError(
            f"{name!r} of {file} was changed in place after save_state(async_save=True) returned and before the "
            "background copy took it (the checkpoint would mix old and new values); call "
            "accelerator.wait_for_checkpoint() before changing weights or optimizer state outside "
            "optimizer.step(), or save synchronously"
        )


stager = Stager()


# -- the background process groups -----------------------------------------------------------------------------
def _group_exists() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def background_group(index: int):
    """The index-th gloo group reserved for background work (None without a process group). Creating one is
    a collective: call it from the main thread, in the same order on every rank."""
    if not _group_exists():
        return None
    import torch.distributed as dist

    if _groups_world[0] is not dist.group.WORLD:
        _groups.clear()
        _groups_world[0] = dist.group.WORLD
    while len(_groups) <= index:
        _groups.append(dist.new_group(backend="gloo"))
    return _groups[index]


def dcp_groups():
    """Hands out one background group per DCP upload of a save (uploads of one save run at the same time, and
    concurrent collectives must not share a group)."""
    counter = iter(range(1, 1 << 30))
    return lambda: background_group(next(counter))


def _agreement_gather(group):
    if group is None:
        return lambda value: [value]

    def gather(value):
        import torch.distributed as dist

        values = [None] * dist.get_world_size(group)
        dist.all_gather_object(values, value, group=group)
        return values

    return gather


# -- one save in flight -----------------------------------------------------------------------------------------
def _test_gate(variable: str = GATE_ENV) -> None:
    gate = os.environ.get(variable)
    while gate and not paths.exists(gate):
        time.sleep(0.01)


def start(temp: str, jobs: list, rank: int, finish, staged: Staged | None = None) -> None:
    """In the background: finish `staged` (copy the live tensors, then let optimizer steps go on), then write
    `jobs` ([(name, write(path))], run in order) into `temp`, then call `finish(problem, written, gather)`:
    the agreement and commit, with `gather` a collective on the writer's own group. The caller has staged
    everything else already and waited for the previous save."""
    global _pending, staging
    group = background_group(0)
    gather = _agreement_gather(group)
    staged = staged or Staged([])
    event = threading.Event() if staged.deferred else None

    def run():
        global _failure
        written, problem = {}, None
        try:
            try:
                _test_gate(STAGE_GATE_ENV)
                staged.finish()
            finally:
                _staged(event)
            _test_gate()
            for name, write in jobs:
                durable.write_file(os.path.join(temp, name), write, rank, sync=False)
            for name, _ in jobs:
                folders.make_durable(temp, name)
                written.update(folders.sizes_under(temp, name))
        except BaseException as error:  # noqa: BLE001 - reported to every rank by `finish`
            problem = error
        try:
            finish(problem, written, gather)
        except BaseException as error:  # noqa: BLE001 - raised on the main thread at the next call
            with _lock:
                _failure = error

    thread = threading.Thread(target=run, name="hasten-checkpoint-writer", daemon=False)
    with _lock:
        _pending = thread
    staging = event
    try:
        thread.start()
    except BaseException:
        _staged(event)
        raise


def _staged(event: threading.Event | None) -> None:
    global staging
    if event is not None:
        if staging is event:
            staging = None
        event.set()


def wait_for_staging() -> None:
    """Block until the save in flight has copied the parameters and optimizer state (not until it is written):
    hasten's optimizer step calls this before it changes them."""
    event = staging
    if event is not None and not event.is_set():
        started = time.perf_counter()
        event.wait()
        waited_for_staging[0] += time.perf_counter() - started


def in_flight() -> bool:
    with _lock:
        return _pending is not None and _pending.is_alive()


def wait() -> None:
    """Block until the save in flight (if any) is committed; raise the error it ended with, once."""
    global _pending, _failure
    with _lock:
        thread = _pending
    if thread is not None:
        thread.join()
    with _lock:
        _pending = None
        failure, _failure = _failure, None
    if failure is not None:
        raise failure


def close() -> None:
    """Wait, then forget the background groups (the process group is about to be destroyed) and the buffers."""
    try:
        wait()
    finally:
        _groups.clear()
        stager.release()


@atexit.register
def _report_at_exit() -> None:
    # Python joined the writer thread before atexit handlers run; only an uncollected error remains.
    with _lock:
        failure = _failure
    if failure is not None:
        print(f"hasten: the last asynchronous save_state failed and nobody waited for it: {failure}", file=sys.stderr)


def refuse(backend) -> ConfigError:
    return ConfigError(
        f"save_state(async_save=True) is not available with the {backend.name} backend (its engine writes its "
        "own checkpoint files); save synchronously: save_state() without async_save"
    )
