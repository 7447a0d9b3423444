"""Skipping the first batches of an epoch (`skip_first_batches`, `SkipDataLoader`): resuming mid-epoch."""

from __future__ import annotations

import logging

from torch.utils.data import BatchSampler, DataLoader, IterableDataset

from ..state import GradientState
from .dispatcher import DataLoaderDispatcher
from .resumable import (
    DataLoaderStateMixin,
    ItselfAsBase,
    ResumableLoader,
    carried_kwargs,
    innermost_batch_sampler,
)
from .samplers import (
    SkipBatchSampler,
)
from .shard import DataLoaderShard
from .stateful import StatefulSwitch

logger = logging.getLogger(__name__)


class SkipDataLoader(StatefulSwitch, DataLoaderStateMixin, DataLoader):
    """A `DataLoader` that drops the first `skip_batches` batches of every pass (for iterable datasets,
    which cannot skip at the sampler). `use_stateful_dataloader=True` makes it a torchdata `StatefulDataLoader`."""

    use_stateful_dataloader = False

    def __init__(self, dataset, skip_batches: int = 0, use_stateful_dataloader: bool = False, **kwargs):
        super().__init__(dataset, **kwargs)
        self.skip_batches = skip_batches
        self._drop_last = self.drop_last
        self.gradient_state = GradientState()

    base_dataloader = ItselfAsBase()

    def _snapshot(self, finished: bool = False) -> None:
        """Only a stateful loader (data/stateful.py) records its position."""

    def __iter__(self):
        self.begin()
        try:
            for index, batch in enumerate(super().__iter__()):
                if index >= self.skip_batches:
                    self._snapshot()
                    yield batch
        finally:
            self.end()


def with_sampler(batch_sampler, sampler):
    """`batch_sampler` drawing from `sampler`; a plain BatchSampler is rebuilt so the user's object is untouched."""
    if batch_sampler is None:
        return None
    if type(batch_sampler) is BatchSampler:
        return BatchSampler(sampler, batch_sampler.batch_size, batch_sampler.drop_last)
    innermost_batch_sampler(batch_sampler).sampler = sampler
    return batch_sampler


def skip_first_batches(dataloader, num_batches: int = 0):
    """A loader like `dataloader` whose passes start after its first `num_batches` batches.

    Map-style datasets skip at the batch sampler (skipped samples are not loaded); iterable datasets read and
    drop them. A prepared loader gives the same kind of prepared loader, with the same device, RNG
    synchronisation, generator and epoch.
    """
    from .xla_loader import XLADeviceLoader

    if isinstance(dataloader, XLADeviceLoader):  # skip in the loader it uploads from; upload the rest the same way
        skipped = XLADeviceLoader(skip_first_batches(dataloader.dataloader, num_batches), dataloader.device,
                                  **dataloader._loader_kwargs)
        skipped._rng_types = dataloader._rng_types
        return skipped
    dataset = dataloader.dataset
    is_stream = isinstance(dataset, IterableDataset)
    kwargs = carried_kwargs(dataloader)
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
    if isinstance(dataloader, ResumableLoader):
        # Accelerate's resume idiom (load_state, then skip_first_batches(loader, k)): the explicit skip replaces
        # the position load_state restored, and once the skipped pass ends the source loader is at the next epoch.
        dataloader._pending_skip = 0
        skipped.__dict__["_skipped_from"] = dataloader
        # The skipped pass is the epoch load_state put back: it replays that epoch's draws from the global RNG.
        skipped._global_draws = dataloader._global_draws
        skipped._replay_global, dataloader._replay_global = dataloader._replay_global, None
    return skipped


def _skipping_loader(dataloader, dataset, is_stream, num_batches, skip_in_loop, kwargs):
    if isinstance(dataloader, DataLoaderDispatcher):
        return DataLoaderDispatcher(
            dataset, split_batches=dataloader.split_batches, skip_batches=skip_in_loop,
            _drop_last=dataloader._drop_last, _non_blocking=dataloader._non_blocking, slice_fn=dataloader.slice_fn,
            torch_device_mesh=dataloader.torch_device_mesh, iteration=dataloader.iteration, **kwargs,
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
