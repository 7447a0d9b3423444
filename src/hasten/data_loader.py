"""Prepared data loaders: which batches each process reads, where they go, and how an epoch resumes.

`prepare_data_loader` turns a plain `DataLoader` into one of two loaders, both real `DataLoader` subclasses:

* `DataLoaderShard`: every process reads its own share (`BatchSamplerShard` for map-style datasets,
  `IterableDatasetShard` for streams) and moves it to its device.
* `DataLoaderDispatcher`: process 0 reads whole steps and broadcasts them; every process keeps its slice.

Both iterate one batch ahead so they know which batch is the last (`end_of_dataloader`, used by gradient
accumulation and `gather_for_metrics`), and both save/restore their position as plain JSON data
(`state_dict()` / `load_state_dict()`), resuming mid-epoch at the next unseen batch with the same shuffle.
"""

from __future__ import annotations

import logging
import math
from contextlib import suppress

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler

from .data.dispatched_batches import check_dispatchable, pad_rows, rows_of
from .core.enums import RNGType
from .core.errors import ConfigError, DistributedOperationException, NotSupportedYetError
from .core.nested import (
    concatenate,
    get_data_structure,
    initialize_tensors,
    is_torch_tensor,
    recursively_apply,
    send_to_device,
    slice_tensors,
)
from .distributed.operations import broadcast, broadcast_object_list
from .parallelism_config import gather_data_parallel, mesh_data_sharding, run_shares_batches
from .distributed.rng import synchronize_rng_states
from .data.samplers import (
    BatchSamplerShard,
    IterableDatasetShard,
    ResumableIndexSampler,
    SeedableRandomSampler,
    SkipBatchSampler,
    set_epoch_through,
)
from .state import GradientState, PartialState

__all__ = [
    "BatchSamplerShard", "DataLoaderDispatcher", "DataLoaderShard", "DataLoaderStateMixin", "IterableDatasetShard",
    "SeedableRandomSampler", "SkipBatchSampler", "SkipDataLoader", "gather_for_metrics", "get_sampler",
    "prepare_data_loader", "skip_first_batches",
]

logger = logging.getLogger(__name__)

# DataLoader arguments carried over to a prepared loader, with torch's defaults. The sampling arguments
# (batch_size, shuffle, sampler, batch_sampler, drop_last) are rebuilt instead.
_LOADER_DEFAULTS = {
    "num_workers": 0,
    "collate_fn": None,
    "pin_memory": False,
    "timeout": 0,
    "worker_init_fn": None,
    "multiprocessing_context": None,
    "generator": None,
    "prefetch_factor": None,
    "persistent_workers": False,
    "pin_memory_device": "",
    "in_order": True,
}

_STATE_VERSION = 1


def _reject_unsupported(use_stateful_dataloader: bool, torch_device_mesh) -> None:
    if use_stateful_dataloader:
        raise NotSupportedYetError(
            "use_stateful_dataloader=True (torchdata's StatefulDataLoader) is not supported by hasten yet. "
            "hasten's prepared loaders resume exactly without it: use `loader.state_dict()` / "
            "`loader.load_state_dict(...)` (or `Accelerator.save_state`) with use_stateful_dataloader=False."
        )
    if torch_device_mesh is not None:
        raise NotSupportedYetError(
            "Preparing a data loader for a torch device mesh (tensor/context parallelism) is not supported by "
            "hasten yet; pass torch_device_mesh=None."
        )


def get_sampler(dataloader):
    """The sampler inside a loader's batch sampler (or inside its `sampler`, when that is a batch sampler)."""
    holder = dataloader.sampler if isinstance(dataloader.sampler, BatchSampler) else dataloader.batch_sampler
    return getattr(holder, "sampler", None)


def _innermost_batch_sampler(batch_sampler):
    while hasattr(batch_sampler, "batch_sampler"):
        batch_sampler = batch_sampler.batch_sampler
    return batch_sampler


class DataLoaderStateMixin:
    """Where a prepared loader stands in its epoch, as `GradientState` reads it.

    `end_of_dataloader` is True while the last batch of the pass is being used; `remainder` is how many samples
    of the last (padded) global batch are real, or -1 when unknown.
    """

    end_of_dataloader = False
    remainder = -1
    _drop_last = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.end_of_dataloader = False
        cls.remainder = -1

    def reset(self) -> None:
        self.end_of_dataloader = False
        self.remainder = -1

    def begin(self) -> None:
        self.reset()
        if not self._drop_last:
            # A loader whose length or batch size is unknown keeps remainder -1 (no duplicate dropping).
            with suppress(Exception):
                self.remainder = self.total_dataset_length % self.total_batch_size
        GradientState()._add_dataloader(self)

    def end(self) -> None:
        GradientState()._remove_dataloader(self)


class _ItselfAsBase:
    """`loader.base_dataloader`: Accelerate wraps a separate DataLoader; a hasten loader is itself that DataLoader.
    Like Accelerate's instance attribute, it is not there on the class (and holding it makes no reference cycle)."""

    def __get__(self, loader, owner=None):
        if loader is None:
            raise AttributeError(f"base_dataloader is set on {owner.__name__} instances, not on the class")
        return loader


class _ResumableLoader(DataLoaderStateMixin, DataLoader):
    """Shared by the prepared loaders: epoch counter, set_epoch, sampler access and exact-resume state."""

    def _init_resume(self, iteration: int, skip_batches: int) -> None:
        self.gradient_state = GradientState()
        self.iteration = iteration
        self.skip_batches = skip_batches
        self._in_epoch = False
        self._batches_yielded = 0
        self._pending_skip = 0
        self._epoch_start_states = None

    # torch reads `_index_sampler` once per iterator; returning our own wrapper lets a resumed pass skip whole
    # batches at the index level, so the skipped samples are never loaded.
    @property
    def _index_sampler(self):
        base = self.batch_sampler if self._auto_collation else self.sampler
        wrapper = self.__dict__.get("_resumable_index_sampler")
        if wrapper is None or wrapper.base is not base:
            wrapper = ResumableIndexSampler(base)
            self.__dict__["_resumable_index_sampler"] = wrapper
        return wrapper

    base_dataloader = _ItselfAsBase()

    @property
    def total_dataset_length(self) -> int:
        return getattr(self.dataset, "total_length", None) or len(self.dataset)

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch of this loader and of every batch sampler, sampler and dataset under it that has one."""
        self.iteration = epoch
        holder = self.sampler if isinstance(self.sampler, BatchSampler) else self.batch_sampler
        set_epoch_through(holder, self.dataset, epoch, sampler=self.sampler if holder is None else None)

    def get_sampler(self):
        return get_sampler(self)

    def set_sampler(self, sampler) -> None:
        holder = self.sampler if isinstance(self.sampler, BatchSampler) else self.batch_sampler
        _innermost_batch_sampler(holder).sampler = sampler

    def _generators(self) -> list:
        """Every generator this loader draws from, in a fixed order, each once."""
        found = []
        sampler = get_sampler(self)
        # A seedable sampler reseeds its generator every pass from (seed, epoch): nothing to save there.
        sampler_generator = None if isinstance(sampler, SeedableRandomSampler) else getattr(sampler, "generator", None)
        for generator in (self.generator, getattr(self, "synchronized_generator", None), sampler_generator):
            if isinstance(generator, torch.Generator) and all(generator is not g for g in found):
                found.append(generator)
        return found

    def _start_pass(self) -> int:
        """Bookkeeping at the start of a pass; returns how many batches a resume asked to skip."""
        self._epoch_start_states = [g.get_state() for g in self._generators()]
        resume, self._pending_skip = self._pending_skip, 0
        self._in_epoch = True
        self._batches_yielded = resume
        return resume

    def _finish_pass(self) -> None:
        self.iteration += 1
        parent = self.__dict__.get("_skipped_from")
        if parent is not None and parent.iteration == self.iteration - 1:
            parent.iteration = self.iteration  # the source loader goes on with the next epoch
        self._in_epoch = False
        self._batches_yielded = 0

    def state_dict(self) -> dict:
        """This loader's position as plain JSON data: epoch, batches already yielded in it, and the states
        that decide its shuffle (generators as they were at the start of the epoch, the seedable seed)."""
        if self._in_epoch:
            states, done = self._epoch_start_states, self._batches_yielded
        else:
            states, done = [g.get_state() for g in self._generators()], self._pending_skip
        state = {
            "version": _STATE_VERSION,
            "epoch": self.iteration,
            "batches_yielded": done,
            "generator_states": [s.tolist() for s in states],
        }
        sampler = get_sampler(self)
        if isinstance(sampler, SeedableRandomSampler):
            state["sampler_seed"] = sampler.initial_seed
        return state

    def load_state_dict(self, state: dict) -> None:
        """Resume: the next pass continues epoch `state["epoch"]` at its first unseen batch, same order."""
        generators = self._generators()
        saved = state.get("generator_states", [])
        if len(saved) != len(generators):
            raise ConfigError(
                f"This data loader state holds {len(saved)} generator state(s) but the loader uses "
                f"{len(generators)}: it was saved from a loader built differently (shuffle, sampler or generator "
                "changed). Prepare the loader the same way as in the run that saved it."
            )
        for generator, values in zip(generators, saved):
            generator.set_state(torch.tensor(values, dtype=torch.uint8))
        sampler = get_sampler(self)
        if "sampler_seed" in state and isinstance(sampler, SeedableRandomSampler):
            sampler.initial_seed = state["sampler_seed"]
        self.iteration = int(state["epoch"])
        self._pending_skip = int(state["batches_yielded"])
        self._in_epoch = False
        self._batches_yielded = 0


class DataLoaderShard(_ResumableLoader):
    """A `DataLoader` that yields this process's batches, moved to `device`.

    Each pass first synchronises `rng_types` from process 0, sets the epoch, then reads one batch ahead so that
    `end_of_dataloader` is True while the last batch is in use. `skip_batches` drops the first batches of
    every pass (used by `skip_first_batches` for iterable datasets).
    """

    def __init__(self, dataset, device=None, rng_types=None, synchronized_generator=None, skip_batches: int = 0,
                 use_stateful_dataloader: bool = False, _drop_last: bool = False, _non_blocking: bool = False,
                 torch_device_mesh=None, iteration: int = 0, **kwargs):
        _reject_unsupported(use_stateful_dataloader, torch_device_mesh)
        super().__init__(dataset, **kwargs)
        self.device = device
        # Batches from a CPU loader already live on the CPU: skip the per-batch walk of the structure.
        self._places_batches = device is not None and torch.device(device).type != "cpu"
        self.rng_types = rng_types
        self.synchronized_generator = synchronized_generator
        self._drop_last = _drop_last
        self._non_blocking = _non_blocking
        self._init_resume(iteration, skip_batches)

    @property
    def total_batch_size(self) -> int:
        holder = self.sampler if isinstance(self.sampler, BatchSampler) else self.batch_sampler
        shard = holder
        while not isinstance(shard, BatchSamplerShard) and hasattr(shard, "batch_sampler"):
            shard = shard.batch_sampler
        if isinstance(shard, BatchSamplerShard):
            return shard.batch_size if shard.split_batches else shard.batch_size * shard.num_processes
        if isinstance(self.dataset, IterableDatasetShard):
            # As in Accelerate: a sharded stream's global length is unknown, so no duplicate dropping.
            raise TypeError("the global batch size of a sharded iterable dataset is not tracked")
        return holder.batch_size

    def __iter__(self):
        if self.rng_types:
            synchronize_rng_states(self.rng_types, self.synchronized_generator)
        self.begin()
        try:
            self.set_epoch(self.iteration)
            resume = self._start_pass()
            skip_in_loop = self.skip_batches
            if isinstance(self.dataset, IterableDataset):
                skip_in_loop += resume  # a stream cannot be skipped without reading it
            else:
                self._index_sampler.skip_next(resume)
            batches = super().__iter__()
            position = 0
            current = next(batches, _END)
            while current is not _END:
                keep = position >= skip_in_loop
                if keep and self._places_batches:
                    current = send_to_device(current, self.device, non_blocking=self._non_blocking)
                following = next(batches, _END)
                if keep:
                    self.end_of_dataloader = following is _END
                    self._batches_yielded += 1
                    yield current
                position += 1
                current = following
            self._finish_pass()
        finally:
            self.end()


_END = object()


class DataLoaderDispatcher(_ResumableLoader):
    """A `DataLoader` where process 0 reads every step and broadcasts it; each process keeps its slice.

    A step is one batch (`split_batches`) or `num_processes` batches concatenated. A final step whose size does not
    divide by the number of processes is completed with rows of the epoch's first step, and `remainder` says how
    many rows were real. Batches are (nested) tensors, optionally with plain values beside them (see
    `dispatched_batches`), which every process receives whole.
    """

    def __init__(self, dataset, split_batches: bool = False, skip_batches: int = 0,
                 use_stateful_dataloader: bool = False, _drop_last: bool = False, _non_blocking: bool = False,
                 slice_fn=None, torch_device_mesh=None, iteration: int = 0, **kwargs):
        _reject_unsupported(use_stateful_dataloader, torch_device_mesh)
        super().__init__(dataset, **kwargs)
        self.state = PartialState()
        self.split_batches = split_batches
        self._drop_last = _drop_last
        self._non_blocking = _non_blocking
        self.slice_fn = slice_tensors if slice_fn is None else slice_fn
        self.rng_types = None
        self.synchronized_generator = None
        self._init_resume(iteration, skip_batches)
        if split_batches:
            batch_size = self._loader_batch_size()
            if batch_size is None or batch_size % self.state.num_processes != 0:
                raise ConfigError(
                    f"split_batches=True with dispatch_batches=True cuts every batch into "
                    f"{self.state.num_processes} equal parts, but the batch size is {batch_size}. Use a batch size "
                    f"divisible by {self.state.num_processes}."
                )

    def _loader_batch_size(self):
        if self.batch_size is not None:
            return self.batch_size
        return getattr(self.batch_sampler if self.batch_sampler is not None else self.sampler, "batch_size", None)

    @property
    def _batches_per_step(self) -> int:
        return 1 if self.split_batches else self.state.num_processes

    @property
    def total_batch_size(self) -> int:
        return self._loader_batch_size() * self._batches_per_step

    def __len__(self) -> int:
        whole = super().__len__()
        if self.split_batches:
            return whole
        if self._drop_last:
            return whole // self.state.num_processes
        return math.ceil(whole / self.state.num_processes)

    def _read_step(self, batches):
        """Process 0: the next step's batch, or None when the pass is over."""
        step = []
        for _ in range(self._batches_per_step):
            batch = next(batches, _END)
            if batch is _END:
                break
            step.append(batch)
        if not step or (len(step) < self._batches_per_step and self._drop_last):
            return None
        for batch in step:
            check_dispatchable(batch, self._batches_per_step, self.state.use_distributed)
        try:
            return step[0] if len(step) == 1 else concatenate(step, dim=0)
        except (RuntimeError, TypeError) as error:
            raise DistributedOperationException(
                f"DataLoaderDispatcher could not concatenate {len(step)} batches into one step ({error}). Batches "
                "of different sizes cannot be dispatched: pass split_batches=True, or dispatch_batches=False so "
                "that every process reads its own batches."
            ) from None

    def __iter__(self):
        self.begin()
        try:
            self.set_epoch(self.iteration)
            resume = self._start_pass()
            is_main = self.state.process_index == 0
            per_step = self._batches_per_step
            # A resumed pass still reads the epoch's first step (not yielded): the last step is padded with its
            # rows, exactly as in an uninterrupted pass.
            reference_first = resume > 0 and not self._drop_last
            keep = per_step if reference_first else 0
            skip = resume * per_step - keep
            batches = None
            if is_main:
                if isinstance(self.dataset, IterableDataset):
                    batches = _without_range(super().__iter__(), skip, after=keep)
                else:
                    self._index_sampler.skip_next(skip, after=keep)
                    batches = super().__iter__()
            yield from self._dispatch(batches, is_main, reference_first)
            self._finish_pass()
        finally:
            self.end()

    def _dispatch(self, batches, is_main: bool, reference_first: bool = False):
        n, rank = self.state.num_processes, self.state.process_index
        device = self.state.device
        first_step = None
        position = 0
        pending = None
        if is_main:
            pending = self._read_step_or_error(batches)
        while True:
            following = None
            message = [None]
            if is_main:
                if isinstance(pending, Exception):
                    message = [("error", pending)]
                else:
                    following = self._read_step_or_error(batches) if pending is not None else None
                    message = [None if pending is None else (get_data_structure(pending), following is None)]
            broadcast_object_list(message)
            announced = message[0]
            if announced is None:
                return
            if announced[0] == "error":
                raise announced[1]
            structure, is_last = announced
            batch = pending if is_main else initialize_tensors(structure)
            batch = recursively_apply(broadcast, send_to_device(batch, device, non_blocking=self._non_blocking))
            if first_step is None:
                first_step = batch
                if reference_first:
                    if is_last:
                        return
                    pending = following
                    continue
            observed = rows_of(batch)
            per_rank = observed // n
            if is_last and not self._drop_last and observed % n != 0:
                per_rank = math.ceil(observed / n)
                batch = pad_rows(batch, first_step, per_rank * n - observed)
                self.remainder = observed
            mine = self.slice_fn(batch, slice(rank * per_rank, (rank + 1) * per_rank),
                                 process_index=rank, num_processes=n)
            if position >= self.skip_batches:
                self.end_of_dataloader = is_last
                self._batches_yielded += 1
                yield mine
            position += 1
            if is_last:
                return
            pending = following

    def _read_step_or_error(self, batches):
        # An error on process 0 is handed to everyone through the next announcement, so no process hangs.
        try:
            return self._read_step(batches)
        except Exception as error:  # noqa: BLE001 - re-raised on every process by _dispatch
            return error


def _without_range(items, count: int, after: int = 0):
    """`items` without the `count` items that follow the first `after` ones."""
    for position, item in enumerate(items):
        if not after <= position < after + count:
            yield item


class SkipDataLoader(DataLoaderStateMixin, DataLoader):
    """A `DataLoader` that drops the first `skip_batches` batches of every pass (for iterable datasets,
    which cannot skip at the sampler)."""

    def __init__(self, dataset, skip_batches: int = 0, use_stateful_dataloader: bool = False, **kwargs):
        _reject_unsupported(use_stateful_dataloader, None)
        super().__init__(dataset, **kwargs)
        self.skip_batches = skip_batches
        self._drop_last = self.drop_last
        self.gradient_state = GradientState()

    base_dataloader = _ItselfAsBase()

    def __iter__(self):
        self.begin()
        try:
            for index, batch in enumerate(super().__iter__()):
                if index >= self.skip_batches:
                    yield batch
        finally:
            self.end()


# -- building prepared loaders ------------------------------------------------------------------------------

def _carried_kwargs(dataloader) -> dict:
    return {name: getattr(dataloader, name, default) for name, default in _LOADER_DEFAULTS.items()}


def _loader_batch_size(dataloader):
    if dataloader.batch_size is not None:
        return dataloader.batch_size
    holder = dataloader.sampler if isinstance(dataloader.sampler, BatchSampler) else dataloader.batch_sampler
    return getattr(holder, "batch_size", None)


def _new_generator(num_processes: int, state: PartialState) -> torch.Generator:
    """A generator seeded from one draw of torch's global RNG, the same seed on every rank of the job."""
    seed = [int(torch.empty((), dtype=torch.int64).random_().item())]
    if state.use_distributed and (num_processes == state.num_processes or run_shares_batches()):
        broadcast_object_list(seed)
    generator = torch.Generator()
    generator.manual_seed(seed[0])
    return generator


def _is_hf_iterable_dataset(dataset) -> bool:
    return type(dataset).__module__.startswith("datasets.") and hasattr(dataset, "n_shards")


def prepare_data_loader(dataloader, device=None, num_processes=None, process_index=None, split_batches=False,
                        put_on_device=False, rng_types=None, dispatch_batches=None, even_batches=True,
                        slice_fn_for_dispatch=None, use_seedable_sampler=False, data_seed=None, non_blocking=False,
                        use_stateful_dataloader=False, torch_device_mesh=None):
    """Wrap `dataloader` so this process reads only its share of every batch (see docs/data.md). With a
    `torch_device_mesh`, the share is this process's data-parallel one: tensor/context ranks read the same batches."""
    _reject_unsupported(use_stateful_dataloader, None)
    if torch_device_mesh is not None:
        num_processes, process_index, dispatch_batches = mesh_data_sharding(torch_device_mesh, dispatch_batches)
    if not isinstance(dataloader, DataLoader):
        raise ConfigError(f"prepare_data_loader needs a torch.utils.data.DataLoader, got {type(dataloader).__name__}.")
    dataset = dataloader.dataset
    is_stream = isinstance(dataset, IterableDataset)
    if dispatch_batches is None:
        dispatch_batches = bool(put_on_device) and is_stream
    elif dispatch_batches and not put_on_device:
        raise ConfigError(
            "dispatch_batches=True broadcasts batches from process 0 straight to every device, so it needs "
            "put_on_device=True (device_placement=True on the Accelerator). Enable it or use dispatch_batches=False."
        )
    state = PartialState()
    num_processes = state.num_processes if num_processes is None else num_processes
    process_index = state.process_index if process_index is None else process_index
    if num_processes < 1 or not 0 <= process_index < num_processes:
        raise ConfigError(f"process_index={process_index} is not a rank of num_processes={num_processes}.")
    batch_size = _loader_batch_size(dataloader)
    if split_batches:
        if batch_size is None:
            raise ConfigError(
                "split_batches=True needs a batch size to split, but the DataLoader has neither `batch_size` nor a "
                "batch sampler with one. Give it a batch_size, or use split_batches=False."
            )
        if batch_size % num_processes != 0:
            raise ConfigError(
                f"split_batches=True cuts every batch into {num_processes} equal parts, but the DataLoader's batch "
                f"size is {batch_size}. Use a batch size divisible by {num_processes}, or split_batches=False."
            )

    kwargs = _carried_kwargs(dataloader)
    shard = num_processes != 1 and not dispatch_batches
    sampler_is_batch_sampler = isinstance(dataloader.sampler, BatchSampler)
    batch_sampler = dataloader.sampler if sampler_is_batch_sampler else dataloader.batch_sampler
    synchronized_generator = None

    if is_stream:
        new_dataset = dataset
        if isinstance(getattr(dataset, "generator", None), torch.Generator):
            synchronized_generator = dataset.generator
        if shard:
            if _is_hf_iterable_dataset(dataset) and dataset.n_shards >= num_processes and not split_batches:
                new_dataset = dataset.shard(num_shards=num_processes, index=process_index)
            else:
                new_dataset = IterableDatasetShard(
                    dataset, batch_size=batch_size if batch_size is not None else 1, drop_last=dataloader.drop_last,
                    num_processes=num_processes, process_index=process_index, split_batches=split_batches,
                )
        kwargs["batch_size"] = batch_size // num_processes if (split_batches and shard) else batch_size
        kwargs["drop_last"] = dataloader.drop_last
    else:
        new_dataset = dataset
        sampler = get_sampler(dataloader) if batch_sampler is not None else dataloader.sampler
        if use_seedable_sampler and isinstance(sampler, RandomSampler) and not isinstance(sampler, SeedableRandomSampler):
            sampler = SeedableRandomSampler(
                sampler.data_source, replacement=sampler.replacement, num_samples=sampler._num_samples,
                generator=sampler.generator, data_seed=data_seed,
            )
            batch_sampler = _with_sampler(batch_sampler, sampler)
        elif hasattr(sampler, "generator") and not isinstance(sampler, SeedableRandomSampler):
            # The shuffle draws from a generator of the loader's own, never from torch's global RNG: iterating
            # then consumes no global randomness, and a resumed run replays exactly the same order.
            if sampler.generator is None:
                sampler.generator = _new_generator(num_processes, state)
            synchronized_generator = sampler.generator
        if batch_sampler is None:
            if shard:
                raise ConfigError(
                    "A DataLoader with batch_size=None and a per-sample sampler cannot be sharded across processes: "
                    "give it a batch_size (or a batch sampler)."
                )
            kwargs.update(sampler=sampler, batch_size=None)
        else:
            if shard:
                batch_sampler = BatchSamplerShard(batch_sampler, num_processes=num_processes,
                                                  process_index=process_index, split_batches=split_batches,
                                                  even_batches=even_batches)
            if sampler_is_batch_sampler:
                kwargs.update(sampler=batch_sampler, batch_size=None)
            else:
                kwargs["batch_sampler"] = batch_sampler

    if kwargs["generator"] is None:
        # torch draws a worker seed when it creates an iterator, from the loader's generator or else from the
        # global RNG. A generator of its own keeps the global stream untouched; keeping it apart from the
        # shuffle's generator keeps the order exact when persistent workers skip that draw on later passes.
        kwargs["generator"] = _new_generator(1, state)
    if rng_types is not None:
        rng_types = [r for r in rng_types if synchronized_generator is not None or RNGType(r) != RNGType.GENERATOR]

    if dispatch_batches:
        return DataLoaderDispatcher(new_dataset, split_batches=split_batches, _drop_last=dataloader.drop_last,
                                    _non_blocking=non_blocking, slice_fn=slice_fn_for_dispatch, **kwargs)
    return DataLoaderShard(new_dataset, device=device if put_on_device else None, rng_types=rng_types,
                           synchronized_generator=synchronized_generator, _drop_last=dataloader.drop_last,
                           _non_blocking=non_blocking, **kwargs)


def _with_sampler(batch_sampler, sampler):
    """`batch_sampler` drawing from `sampler`; a plain BatchSampler is rebuilt so the user's object is untouched."""
    if batch_sampler is None:
        return None
    if type(batch_sampler) is BatchSampler:
        return BatchSampler(sampler, batch_sampler.batch_size, batch_sampler.drop_last)
    _innermost_batch_sampler(batch_sampler).sampler = sampler
    return batch_sampler


def skip_first_batches(dataloader, num_batches: int = 0):
    """A loader like `dataloader` whose passes start after its first `num_batches` batches.

    Map-style datasets skip at the batch sampler (skipped samples are not loaded); iterable datasets read and
    drop them. A prepared loader gives the same kind of prepared loader, with the same device, RNG
    synchronisation, generator and epoch.
    """
    dataset = dataloader.dataset
    is_stream = isinstance(dataset, IterableDataset)
    kwargs = _carried_kwargs(dataloader)
    skip_in_loop = 0
    if is_stream:
        kwargs.update(batch_size=dataloader.batch_size, drop_last=dataloader.drop_last)
        skip_in_loop = num_batches
    else:
        sampler_is_batch_sampler = isinstance(dataloader.sampler, BatchSampler)
        holder = dataloader.sampler if sampler_is_batch_sampler else dataloader.batch_sampler
        per_batch = dataloader._batches_per_step if isinstance(dataloader, DataLoaderDispatcher) else 1
        skipping = SkipBatchSampler(holder, skip_batches=num_batches * per_batch)
        if sampler_is_batch_sampler:
            kwargs.update(sampler=skipping, batch_size=None)
        else:
            kwargs["batch_sampler"] = skipping

    skipped = _skipping_loader(dataloader, dataset, is_stream, num_batches, skip_in_loop, kwargs)
    if isinstance(dataloader, _ResumableLoader):
        # Accelerate's resume idiom (load_state, then skip_first_batches(loader, k)): the explicit skip replaces
        # the position load_state restored, and once the skipped pass ends the source loader is at the next epoch.
        dataloader._pending_skip = 0
        skipped.__dict__["_skipped_from"] = dataloader
    return skipped


def _skipping_loader(dataloader, dataset, is_stream, num_batches, skip_in_loop, kwargs):
    if isinstance(dataloader, DataLoaderDispatcher):
        return DataLoaderDispatcher(
            dataset, split_batches=dataloader.split_batches, skip_batches=skip_in_loop,
            _drop_last=dataloader._drop_last, _non_blocking=dataloader._non_blocking, slice_fn=dataloader.slice_fn,
            iteration=dataloader.iteration, **kwargs,
        )
    if isinstance(dataloader, DataLoaderShard):
        return DataLoaderShard(
            dataset, device=dataloader.device, rng_types=dataloader.rng_types,
            synchronized_generator=dataloader.synchronized_generator, skip_batches=skip_in_loop,
            _drop_last=dataloader._drop_last, _non_blocking=dataloader._non_blocking,
            iteration=dataloader.iteration, **kwargs,
        )
    if is_stream:
        return SkipDataLoader(dataset, skip_batches=num_batches, **kwargs)
    return DataLoader(dataset, **kwargs)


# -- metrics -------------------------------------------------------------------------------------------------

def gather_for_metrics(input_data, use_gather_object: bool = False):
    """Gather `input_data` from every process, dropping the samples that even batching duplicated.

    Tensors (in nested lists/tuples/dicts) are all-gathered; anything else, or `use_gather_object=True`, goes
    through `gather_object` (a flat list). On the last batch of a prepared loader, only the first `remainder`
    gathered items are kept. Every process must call it the same number of times (not with even_batches=False
    when processes get different batch counts).
    """
    try:
        recursively_apply(lambda t: t, input_data, error_on_other_type=True)
        all_tensors = True
    except TypeError:
        all_tensors = False
    as_objects = use_gather_object or not all_tensors
    data = gather_data_parallel(input_data, as_objects)
    try:
        gradient_state = GradientState()
        if not gradient_state.end_of_dataloader:
            return data
        remainder = gradient_state.remainder
        if remainder == -1:
            logger.info(
                "gather_for_metrics: the dataset length is unknown, so duplicated samples on the last batch "
                "cannot be dropped; returning everything gathered."
            )
            return data
        if remainder > 0:
            if as_objects:
                return data[:remainder]
            return recursively_apply(lambda t: t[:remainder], data, test_type=is_torch_tensor)
        return data
    except Exception:  # noqa: BLE001 - Accelerate's contract: never fail after the gather succeeded
        return data


class override_even_batches:
    """For `join_uneven_inputs(even_batches=...)`: set `even_batches` on the shard samplers of prepared map-style
    loaders for the block and restore them after; an iterable loader cannot change and is named in a warning."""

    def __init__(self, loaders, even_batches: bool):
        self.loaders, self.even_batches, self.saved = list(loaders), even_batches, []

    def __enter__(self):
        for loader in self.loaders:
            holder = loader.sampler if isinstance(loader.sampler, BatchSampler) else loader.batch_sampler
            if hasattr(holder, "even_batches"):
                self.saved.append((holder, holder.even_batches))
                holder.even_batches = self.even_batches
            else:
                logger.warning("join_uneven_inputs: even_batches cannot be changed for %s (an iterable or unsharded "
                               "loader); it keeps its setting", type(loader).__name__)
        return self

    def __exit__(self, *exc_info):
        for holder, value in self.saved:
            holder.even_batches = value
        return False


from .data.adapter import DataLoaderAdapter  # noqa: E402,F401 - Accelerate's path for it
