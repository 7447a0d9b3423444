"""`DataLoaderShard`: every process reads its own share of each step and moves it to its device."""

from __future__ import annotations

import logging

import torch
from torch.utils.data import BatchSampler, IterableDataset

from ..core.nested import (
    send_to_device,
)
from ..distributed.rng import synchronize_rng_states
from .resumable import END, ResumableLoader, reject_unsupported
from .samplers import (
    BatchSamplerShard,
    IterableDatasetShard,
)

logger = logging.getLogger(__name__)


class DataLoaderShard(ResumableLoader):
    """A `DataLoader` that yields this process's batches, moved to `device`.

    Each pass first synchronises `rng_types` from process 0, sets the epoch, then reads one batch ahead so that
    `end_of_dataloader` is True while the last batch is in use. `skip_batches` drops the first batches of
    every pass (used by `skip_first_batches` for iterable datasets).
    """

    def __init__(self, dataset, device=None, rng_types=None, synchronized_generator=None, skip_batches: int = 0,
                 use_stateful_dataloader: bool = False, _drop_last: bool = False, _non_blocking: bool = False,
                 torch_device_mesh=None, iteration: int = 0, **kwargs):
        reject_unsupported(torch_device_mesh)
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
            return self.dataset._group_size  # one group of the stream is one global batch
        return holder.batch_size

    @property
    def total_dataset_length(self) -> int:
        if isinstance(self.dataset, IterableDatasetShard):
            return len(self.dataset.dataset)  # the whole stream's length (a TypeError when it has none)
        return super().total_dataset_length

    def _learn_remainder(self) -> None:
        """An unsized sharded stream read in this process tells how many rows of its last global batch are real
        (the rest repeat its first batch), so `gather_for_metrics` can drop exactly the repeats."""
        if self.remainder == -1 and isinstance(self.dataset, IterableDatasetShard) and self.num_workers == 0 \
                and not self._drop_last:
            self.remainder = getattr(self.dataset, "last_group_real", -1)

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
            elif resume:
                self._index_sampler.skip_next(resume)
            batches = super().__iter__()
            position = 0
            current = next(batches, END)
            self._close_draws()
            while current is not END:
                keep = position >= skip_in_loop
                if keep and self._places_batches:
                    current = send_to_device(current, self.device, non_blocking=self._non_blocking)
                self._snapshot()
                following = next(batches, END)
                if keep:
                    self.end_of_dataloader = following is END
                    if self.end_of_dataloader:
                        self._snapshot(finished=True)
                        self._learn_remainder()
                    self._batches_yielded += 1
                    yield current
                position += 1
                current = following
            self._finish_pass()
        finally:
            self._close_draws()
            self.end()
