"""`DataLoaderDispatcher`: process 0 reads whole steps and broadcasts them; every process keeps its slice."""

from __future__ import annotations

import logging
import math

import torch
from torch.utils.data import IterableDataset

from ..core.errors import ConfigError, DistributedOperationException
from ..core.nested import (
    concatenate,
    get_data_structure,
    initialize_tensors,
    recursively_apply,
    send_to_device,
    slice_tensors,
)
from ..distributed.operations import broadcast, broadcast_object_list
from ..state import PartialState
from .dispatched_batches import check_dispatchable, pad_rows, rows_of
from .ranks import data_ranks, splits_data_ranks
from .resumable import END, ResumableLoader, without_range

logger = logging.getLogger(__name__)


class DataLoaderDispatcher(ResumableLoader):
    """A `DataLoader` where process 0 reads every step and broadcasts it; each process keeps its slice.

    A step is one batch (`split_batches`) or one batch per data-parallel rank, concatenated. A final step whose size
    does not divide by the number of data-parallel ranks is completed with rows of the epoch's first step, and
    `remainder` says how many rows were real. With a `torch_device_mesh` that has a tensor-parallel dimension, the
    ranks of one tensor-parallel group are one data-parallel rank: they all keep the same slice. Batches are (nested) tensors, optionally with plain values beside them (see
    `dispatched_batches`), which every process receives whole.
    """

    position_on_main_only = True  # only process 0 reads the data: its position is the loader's

    def __init__(self, dataset, split_batches: bool = False, skip_batches: int = 0,
                 use_stateful_dataloader: bool = False, _drop_last: bool = False, _non_blocking: bool = False,
                 slice_fn=None, torch_device_mesh=None, iteration: int = 0, **kwargs):
        super().__init__(dataset, **kwargs)
        self.state = PartialState()
        self.torch_device_mesh = torch_device_mesh
        # Slices go to data-parallel ranks: every process, unless tensor-parallel ranks share one.
        if splits_data_ranks(torch_device_mesh):
            self._data_size, self._data_index = data_ranks(torch_device_mesh)
        else:
            self._data_size, self._data_index = self.state.num_processes, self.state.process_index
        self.split_batches = split_batches
        self._drop_last = _drop_last
        self._non_blocking = _non_blocking
        self.slice_fn = slice_tensors if slice_fn is None else slice_fn
        self.rng_types = None
        self.synchronized_generator = None
        self._init_resume(iteration, skip_batches)
        if split_batches:
            batch_size = self._loader_batch_size()
            if batch_size is None or batch_size % self._data_size != 0:
                raise ConfigError(
                    f"To use a `DataLoader` in `split_batches` mode, the batch size ({batch_size}) needs to be a round "
                    f"multiple of the number of processes ({self._data_size}): split_batches=True with "
                    f"dispatch_batches=True cuts every batch into {self._data_size} equal parts. Use a batch "
                    f"size divisible by {self._data_size}."
                )

    def _loader_batch_size(self):
        if self.batch_size is not None:
            return self.batch_size
        return getattr(self.batch_sampler if self.batch_sampler is not None else self.sampler, "batch_size", None)

    @property
    def _batches_per_step(self) -> int:
        return 1 if self.split_batches else self._data_size

    @property
    def total_batch_size(self) -> int:
        return self._loader_batch_size() * self._batches_per_step

    def __len__(self) -> int:
        whole = super().__len__()
        if self.split_batches:
            return whole
        if self._drop_last:
            return whole // self._data_size
        return math.ceil(whole / self._data_size)

    def _read_step(self, batches):
        """Process 0: the next step's batch, or None when the pass is over."""
        step = []
        for _ in range(self._batches_per_step):
            batch = next(batches, END)
            if batch is END:
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
            if not is_main:
                self._draw_worker_seed_as_reader()
            if is_main:
                if isinstance(self.dataset, IterableDataset):
                    batches = without_range(super().__iter__(), skip, after=keep)
                else:
                    if skip:
                        self._index_sampler.skip_next(skip, after=keep)
                    batches = super().__iter__()
            yield from self._dispatch(batches, is_main, reference_first)
            self._finish_pass()
        finally:
            self._close_draws()
            self.end()

    def _draws_worker_seed(self) -> bool:
        if self.state.process_index == 0:
            return super()._draws_worker_seed()
        return self.generator is None and not (self.persistent_workers and self.num_workers > 0
                                               and self.__dict__.get("_worker_seed_taken", False))

    def _draw_worker_seed_as_reader(self) -> None:
        """A process that does not read: Accelerate makes an iterator on every process, so each one draws a
        worker seed from the global RNG per pass; hasten draws the same number without starting workers."""
        if self._pass_draws_worker_seed:
            torch.empty((), dtype=torch.int64).random_(generator=self.generator)
            self.__dict__["_worker_seed_taken"] = True
        self._close_draws()

    def _dispatch(self, batches, is_main: bool, reference_first: bool = False):
        n, rank = self._data_size, self._data_index
        device = self.state.device
        first_step = None
        position = 0
        pending = None
        if is_main:
            pending = self._read_step_or_error(batches)
            self._close_draws()
        while True:
            following = None
            message = [None]
            if is_main:
                if isinstance(pending, Exception):
                    message = [("error", pending)]
                else:
                    if pending is not None:
                        self._snapshot()  # the position after the step about to be dispatched
                    following = self._read_step_or_error(batches) if pending is not None else None
                    if pending is not None and following is None:
                        self._snapshot(finished=True)
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
            if is_last:
                self.remainder = observed  # every real row of the last step, padded or not (as Accelerate)
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
