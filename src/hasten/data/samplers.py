"""Samplers and dataset wrappers that decide which samples each process reads.

Everything here is plain Python over index lists: it never touches torch.distributed, so every rule can be
checked in one process by passing `num_processes` / `process_index` explicitly.
"""

from __future__ import annotations

import math
import weakref

import torch
from torch.utils.data import BatchSampler, IterableDataset, RandomSampler

from ..core.errors import ConfigError

__all__ = [
    "BatchSamplerShard", "IterableDatasetShard", "SeedableRandomSampler", "SkipBatchSampler", "set_epoch_through",
]


def _check_split(batch_size, num_processes: int, what: str, owner: str) -> None:
    if batch_size is None:
        raise ConfigError(
            f"split_batches=True needs to know the batch size, but {what} has none. Give the DataLoader a "
            "`batch_size` (or a batch sampler with a `batch_size` attribute), or use split_batches=False."
        )
    if batch_size % num_processes != 0:
        raise ConfigError(
            f"To use `{owner}` in `split_batches` mode, the batch size ({batch_size}) needs to be a round multiple "
            f"of the number of processes ({num_processes}): split_batches=True cuts every batch into {num_processes} "
            f"equal parts. Use a batch size divisible by {num_processes}, or split_batches=False."
        )


def _check_rank(num_processes: int, process_index: int) -> None:
    if num_processes < 1 or not 0 <= process_index < num_processes:
        raise ConfigError(
            f"process_index={process_index} is not a rank of num_processes={num_processes}: it must be in "
            f"[0, {num_processes})."
        )


class SeedableRandomSampler(RandomSampler):
    """A `RandomSampler` whose order depends only on `initial_seed + epoch`: the same on every process.

    `initial_seed` is `data_seed`, or `torch.random.initial_seed()` when that is None. The epoch advances by one
    after every complete pass; `set_epoch` sets it (the prepared loader calls it at the start of each pass).
    """

    def __init__(self, *args, data_seed: int | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.initial_seed = data_seed if data_seed is not None else torch.random.initial_seed()
        self.epoch = 0

    def __iter__(self):
        if self.generator is None:
            self.generator = torch.Generator(device=torch.get_default_device())
        self.generator.manual_seed(self.initial_seed + self.epoch)
        yield from super().__iter__()
        self.set_epoch(self.epoch + 1)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch


def set_epoch_through(batch_sampler, dataset, epoch: int, sampler=None) -> None:
    """Announce `epoch` once to everything under a loader that keeps one: each batch sampler the user wrote in
    the chain, the sampler they draw from and the dataset. A custom batch sampler that reseeds per epoch and a
    seedable sampler under it both need it; hasten's own wrappers only pass it on, so they are not called."""
    targets = []
    level = batch_sampler
    while level is not None:
        if not isinstance(level, _WrappedBatchSampler):
            targets.append(level)
        inner = getattr(level, "batch_sampler", None)
        if inner is None:
            sampler = getattr(level, "sampler", sampler)
        level = inner
    targets += [sampler, dataset]
    called = []
    for target in targets:
        if hasattr(target, "set_epoch") and all(target is not done for done in called):
            target.set_epoch(epoch)
            called.append(target)


class _WrappedBatchSampler(BatchSampler):
    """A batch sampler built over another one: exposes its sampler and length, forwards `set_epoch`.
    (BatchSampler.__init__ validates a sampler we do not have, so subclasses set their attributes themselves.)"""

    batch_sampler: BatchSampler

    @property
    def sampler(self):
        return getattr(self.batch_sampler, "sampler", None)

    @property
    def total_length(self) -> int:
        return len(self.batch_sampler)

    def set_epoch(self, epoch: int) -> None:
        set_epoch_through(self, None, epoch)


class BatchSamplerShard(_WrappedBatchSampler):
    """This process's share of the batches of `batch_sampler`.

    Without `split_batches`, batches are dealt round-robin (batch k to process k % num_processes). With
    `split_batches`, every batch is cut into `num_processes` contiguous slices and process i takes slice i.
    With `even_batches` (the default) every process gets the same number of full-size batches: the last round
    is completed with samples from the start of the epoch (dropped again by `gather_for_metrics`).
    """

    def __init__(self, batch_sampler, num_processes: int = 1, process_index: int = 0, split_batches: bool = False,
                 even_batches: bool = True):
        _check_rank(num_processes, process_index)
        batch_size = getattr(batch_sampler, "batch_size", None)
        if split_batches:
            _check_split(batch_size, num_processes, f"the batch sampler {type(batch_sampler).__name__}",
                         "BatchSamplerShard")
        # BatchSampler.__init__ validates a sampler we do not have; set its public attributes ourselves.
        self.batch_sampler = batch_sampler
        self.num_processes = num_processes
        self.process_index = process_index
        self.split_batches = split_batches
        self.even_batches = even_batches
        self.batch_size = batch_size
        self.drop_last = getattr(batch_sampler, "drop_last", False)

    def __len__(self) -> int:
        total = len(self.batch_sampler)
        if self.split_batches:
            if self.even_batches or self.drop_last or total == 0:
                return total
            # Uneven: a short last batch may hold nothing for this process's slice.
            try:
                short = len(self.sampler) % self.batch_size
            except TypeError:
                return total
            starts_after_short = short and self.process_index * (self.batch_size // self.num_processes) >= short
            return total - 1 if starts_after_short else total
        full_rounds, leftover = divmod(total, self.num_processes)
        if leftover == 0 or self.drop_last:
            return full_rounds
        return full_rounds + (1 if self.even_batches or self.process_index < leftover else 0)

    def __iter__(self):
        return self._iter_split() if self.split_batches else self._iter_dealt()

    def _iter_split(self):
        n, i = self.num_processes, self.process_index
        per_process = self.batch_size // n
        first_batch = None
        for batch in self.batch_sampler:
            batch = list(batch)
            if first_batch is None:
                first_batch = batch
            if len(batch) < self.batch_size:  # only the last batch can be short
                if self.drop_last:
                    return
                if self.even_batches:
                    batch = batch + _cycle_take(first_batch, self.batch_size - len(batch))
            part = batch[i * per_process:(i + 1) * per_process]
            if part:
                yield part

    def _iter_dealt(self):
        n, i = self.num_processes, self.process_index
        opening: list = []  # the first `n` batches of the epoch, to complete the last round
        round_: list = []
        for batch in self.batch_sampler:
            batch = list(batch)
            if len(opening) < n:
                opening.append(batch)
            round_.append(batch)
            if len(round_) == n:
                if self.batch_size is not None and len(round_[-1]) != self.batch_size:
                    break  # a short batch ends the epoch; handled below with the rest of its round
                yield round_[i]
                round_ = []
        if not round_ or self.drop_last:
            return
        if not self.even_batches:
            if i < len(round_):
                yield round_[i]
            return
        if self.batch_size is None:
            # Batches of varying size: complete the round with whole batches from the start of the epoch.
            round_ += _cycle_take(opening, n - len(round_))
            yield round_[i]
            return
        samples = [index for batch in round_ for index in batch]
        opening_samples = [index for batch in opening for index in batch]
        samples += _cycle_take(opening_samples, n * self.batch_size - len(samples))
        yield samples[i * self.batch_size:(i + 1) * self.batch_size]


def _cycle_take(source: list, count: int) -> list:
    """`count` items taken by cycling through `source`."""
    if count <= 0:
        return []
    return [source[k % len(source)] for k in range(count)]


class IterableDatasetShard(IterableDataset):
    """This process's share of a stream: it reads groups of `batch_size * num_processes` items (`batch_size`
    with `split_batches`) and keeps its slice. Unless `drop_last`, the last partial group is completed with items
    from the first group so that every process yields the same number of items."""

    def __init__(self, dataset, batch_size: int = 1, drop_last: bool = False, num_processes: int = 1,
                 process_index: int = 0, split_batches: bool = False):
        _check_rank(num_processes, process_index)
        if split_batches and batch_size > 1:
            _check_split(batch_size, num_processes, "the data loader", "IterableDatasetShard")
        self.dataset = dataset
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.num_processes = num_processes
        self.process_index = process_index
        self.split_batches = split_batches
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)

    @property
    def _group_size(self) -> int:
        return self.batch_size if self.split_batches else self.batch_size * self.num_processes

    @property
    def _per_process(self) -> int:
        return self.batch_size // self.num_processes if self.split_batches else self.batch_size

    def __len__(self) -> int:
        groups = len(self.dataset) / self._group_size
        return (math.floor(groups) if self.drop_last else math.ceil(groups)) * self._per_process

    def __iter__(self):
        generator = getattr(self.dataset, "generator", None)
        if not hasattr(self.dataset, "set_epoch") and isinstance(generator, torch.Generator):
            generator.manual_seed(self.epoch)
        group_size, per_process = self._group_size, self._per_process
        start = self.process_index * per_process
        first_group = None
        group: list = []
        # Real items in the last group yielded (0: it was whole): in-process readers (num_workers=0) of an unsized
        # stream learn from it how many gathered rows of the last batch are real (`gather_for_metrics`).
        self.last_group_real = 0
        for item in self.dataset:
            group.append(item)
            if len(group) == group_size:
                yield from group[start:start + per_process]
                if first_group is None:
                    first_group = group
                group = []
        if group and not self.drop_last:
            self.last_group_real = len(group)
            group += _cycle_take(first_group or list(group), group_size - len(group))
            yield from group[start:start + per_process]


class SkipBatchSampler(_WrappedBatchSampler):
    """`batch_sampler` without its first `skip_batches` batches; the indices are skipped, no data is read."""

    def __init__(self, batch_sampler, skip_batches: int = 0):
        self.batch_sampler = batch_sampler
        self.skip_batches = skip_batches
        self.batch_size = getattr(batch_sampler, "batch_size", None)
        self.drop_last = getattr(batch_sampler, "drop_last", False)

    def __iter__(self):
        for index, batch in enumerate(self.batch_sampler):
            if index >= self.skip_batches:
                yield batch

    def __len__(self) -> int:
        return max(0, len(self.batch_sampler) - self.skip_batches)


class ResumableIndexSampler:
    """What a prepared loader's iterator draws indices from: the real (batch) sampler, plus a one-shot skip.

    `skip_next(count, after)` makes the next pass leave out `count` entries following its first `after` ones, so a
    resumed epoch continues at the next unseen batch without reading the skipped samples. The object stays the same
    across passes, so persistent workers (which keep the index sampler of their first iterator) see the skip too.
    """

    def __init__(self, base, owner=None):
        self.base = base
        # The loader, told when the pass's draws from the global RNG begin and end (weakly held: the loader holds
        # this object, and must still be freed by reference counting alone).
        self._owner = weakref.ref(owner) if owner is not None else None
        self._pending = (0, 0)

    @property
    def owner(self):
        return self._owner() if self._owner is not None else None

    def __getstate__(self):
        return {**self.__dict__, "_owner": None}

    def skip_next(self, count: int, after: int = 0) -> None:
        self._pending = (count, after)

    def __len__(self) -> int:
        return len(self.base)

    def __iter__(self):
        # Lazy on purpose, skip count included: torch draws the worker seed from the loader's generator before
        # the first index is requested (a resumed pass must draw in the same order as an uninterrupted one), and
        # the multi-process iterator calls iter() twice but only advances the second.
        (count, after), self._pending = self._pending, (0, 0)
        owner = self.owner
        if owner is not None:
            owner._sampler_draws()
        for position, entry in enumerate(self.base):
            if position == 0 and owner is not None:
                owner._close_draws()  # a sampler draws its shuffle seed before its first index
            if not after <= position < after + count:
                yield entry
        if owner is not None:
            owner._close_draws()
