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

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler

from .config.resolve import data_own_rng
from .core.enums import DistributedType, RNGType
from .core.errors import ConfigError
from .data.dispatcher import DataLoaderDispatcher
from .data.metrics import gather_for_metrics
from .data.resumable import DataLoaderStateMixin, carried_kwargs, get_sampler
from .data.samplers import (
    BatchSamplerShard,
    IterableDatasetShard,
    SeedableRandomSampler,
    SkipBatchSampler,
)
from .data.shard import DataLoaderShard
from .data.stateful import stateful_dataloader_class
from .data.skipping import SkipDataLoader, skip_first_batches, with_sampler
from .distributed.operations import broadcast_object_list
from .data.ranks import mesh_data_sharding, run_shares_batches
from .state import PartialState

__all__ = [
    "BatchSamplerShard", "DataLoaderDispatcher", "DataLoaderShard", "DataLoaderStateMixin", "IterableDatasetShard",
    "SeedableRandomSampler", "SkipBatchSampler", "SkipDataLoader", "gather_for_metrics", "get_sampler",
    "prepare_data_loader", "skip_first_batches",
]

logger = logging.getLogger(__name__)

# -- building prepared loaders ------------------------------------------------------------------------------

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
    if use_stateful_dataloader:
        stateful_dataloader_class()  # fail before any work when torchdata is missing
    own_rng = data_own_rng()
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
                f"To use a `DataLoader` in `split_batches` mode, the batch size ({batch_size}) needs to be a round "
                f"multiple of the number of processes ({num_processes}): split_batches=True cuts every batch into "
                f"{num_processes} equal parts. Use a batch size divisible by {num_processes}, or split_batches=False."
            )

    kwargs = carried_kwargs(dataloader)
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
            batch_sampler = with_sampler(batch_sampler, sampler)
        elif hasattr(sampler, "generator") and not isinstance(sampler, SeedableRandomSampler):
            # Shared by the processes that read their own shares (as Accelerate, seeded from one global draw, but
            # with process 0's seed everywhere). Otherwise, as in torch, each pass draws a shuffle seed from the
            # global RNG, unless data_own_rng gives the loader a generator of its own.
            if sampler.generator is None and (shard or own_rng):
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

    if dispatch_batches and not own_rng:
        kwargs["generator"] = None  # as Accelerate's dispatcher: the worker seed comes from the global RNG
    if kwargs["generator"] is None and own_rng:
        # torch draws a worker seed when it creates an iterator, from the loader's generator or else from the
        # global RNG. A generator of its own keeps the global stream untouched; keeping it apart from the
        # shuffle's generator keeps the order exact when persistent workers skip that draw on later passes.
        kwargs["generator"] = _new_generator(1, state)
    if rng_types is not None:
        rng_types = [r for r in rng_types if synchronized_generator is not None or RNGType(r) != RNGType.GENERATOR]

    if dispatch_batches:
        loader = DataLoaderDispatcher(new_dataset, split_batches=split_batches, _drop_last=dataloader.drop_last,
                                    _non_blocking=non_blocking, slice_fn=slice_fn_for_dispatch,
                                    use_stateful_dataloader=use_stateful_dataloader,
                                    torch_device_mesh=torch_device_mesh, **kwargs)
    else:
        on_xla = state.distributed_type == DistributedType.XLA  # MpDeviceLoader uploads the batches there
        loader = DataLoaderShard(new_dataset, device=device if put_on_device and not on_xla else None, rng_types=rng_types,
                                 synchronized_generator=synchronized_generator, _drop_last=dataloader.drop_last,
                                 _non_blocking=non_blocking, use_stateful_dataloader=use_stateful_dataloader,
                                 **kwargs)
    loader._global_draws = not own_rng
    if state.distributed_type == DistributedType.XLA:  # as Accelerate: every prepared loader uploads through MpDeviceLoader
        from .data.xla_loader import XLADeviceLoader

        return XLADeviceLoader(loader, device if device is not None else state.device)
    return loader


# The loaders, samplers and helpers Accelerate publishes at this path; each lives in its own module of `data/`.
from .data.adapter import DataLoaderAdapter  # noqa: E402,F401
