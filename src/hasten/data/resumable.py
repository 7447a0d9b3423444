"""The loaders' common base: iterate one batch ahead (to know the last batch), keep `end_of_dataloader` /
`remainder` in the gradient state, and save/restore the position as plain data (`state_dict`)."""

from __future__ import annotations

import logging
from contextlib import suppress

import torch
from torch.utils.data import BatchSampler, DataLoader

from ..core.errors import ConfigError, NotSupportedYetError
from ..state import GradientState
from .samplers import (
    ResumableIndexSampler,
    SeedableRandomSampler,
    set_epoch_through,
)
from .stateful import StatefulSwitch

logger = logging.getLogger(__name__)


# DataLoader arguments carried over to a prepared loader, with torch's defaults. The sampling arguments
# (batch_size, shuffle, sampler, batch_sampler, drop_last) are rebuilt instead.
LOADER_DEFAULTS = {
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

END = object()

_STATE_VERSION = 1


def get_sampler(dataloader):
    """The sampler inside a loader's batch sampler (or inside its `sampler`, when that is a batch sampler)."""
    holder = dataloader.sampler if isinstance(dataloader.sampler, BatchSampler) else dataloader.batch_sampler
    return getattr(holder, "sampler", None)


def innermost_batch_sampler(batch_sampler):
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


class ItselfAsBase:
    """`loader.base_dataloader`: Accelerate wraps a separate DataLoader; a hasten loader is itself that DataLoader.
    Like Accelerate's instance attribute, it is not there on the class (and holding it makes no reference cycle)."""

    def __get__(self, loader, owner=None):
        if loader is None:
            raise AttributeError(f"base_dataloader is set on {owner.__name__} instances, not on the class")
        return loader


class ResumableLoader(StatefulSwitch, DataLoaderStateMixin, DataLoader):
    """Shared by the prepared loaders: epoch counter, set_epoch, sampler access and exact-resume state.
    With `use_stateful_dataloader=True` the loader is built as a torchdata `StatefulDataLoader` too
    (`data/stateful.py`), whose `state_dict` then replaces the one below."""

    use_stateful_dataloader = False
    # Iterating draws from torch's global RNG where torch does (a worker seed per iterator, a shuffle seed per
    # pass of a sampler without a generator). prepare_data_loader sets False under data_own_rng, where the
    # loader's own generators make those draws and the global RNG is never touched.
    _global_draws = True

    def _init_resume(self, iteration: int, skip_batches: int) -> None:
        self.gradient_state = GradientState()
        self.iteration = iteration
        self.skip_batches = skip_batches
        self._in_epoch = False
        self._batches_yielded = 0
        self._pending_skip = 0
        self._epoch_start_states = None
        # The global RNG as the epoch's pass began (state, whether that pass drew a worker seed): what its draws,
        # hence its order, came from. A loaded state replays it (`_replay_global`) instead of drawing afresh.
        self._epoch_start_global = None
        self._replay_global = None
        self._live_global = None
        self._pass_draws_worker_seed = False

    # torch reads `_index_sampler` once per iterator; returning our own wrapper lets a resumed pass skip whole
    # batches at the index level, so the skipped samples are never loaded.
    @property
    def _index_sampler(self):
        base = self.batch_sampler if self._auto_collation else self.sampler
        wrapper = self.__dict__.get("_resumable_index_sampler")
        if wrapper is None or wrapper.base is not base:
            wrapper = ResumableIndexSampler(base, owner=self)
            self.__dict__["_resumable_index_sampler"] = wrapper
        return wrapper

    base_dataloader = ItselfAsBase()

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
        innermost_batch_sampler(holder).sampler = sampler

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

    def _snapshot(self, finished: bool = False) -> None:
        """Called before each read ahead; only a stateful loader (data/stateful.py) records anything."""

    def _draws_worker_seed(self) -> bool:
        """Whether this pass's iterator draws a worker seed from the global RNG: torch draws one per iterator
        made, from the loader's generator when it has one; persistent workers keep their first iterator."""
        if self.generator is not None:
            return False
        return not (self.persistent_workers and self.num_workers > 0 and self._iterator is not None)

    def _open_draws(self) -> None:
        """At the start of a pass, before its iterator is made: note the global RNG its draws come from, or, for
        a loaded state, let them come from the saved one (the live state comes back in `_close_draws`)."""
        replay, self._replay_global = self._replay_global, None
        self._pass_draws_worker_seed = self._draws_worker_seed()
        if not self._global_draws:
            self._epoch_start_global = None
            return
        if replay is None:
            self._epoch_start_global = (torch.get_rng_state(), self._pass_draws_worker_seed)
            return
        self._epoch_start_global = replay
        self._live_global = torch.get_rng_state()
        torch.set_rng_state(replay[0])

    def _sampler_draws(self) -> None:
        """The index sampler starts its pass (its shuffle draw comes next). In a replay whose iterator does not
        draw a worker seed as the saved pass did (persistent workers), put the global RNG where it was then."""
        if self._live_global is None or self._epoch_start_global[1] == self._pass_draws_worker_seed:
            return
        state, drew = self._epoch_start_global
        generator = torch.Generator()
        generator.set_state(state)
        if drew:
            torch.empty((), dtype=torch.int64).random_(generator=generator)
        torch.set_rng_state(generator.get_state())

    def _close_draws(self) -> None:
        """The pass's draws are made (its iterator exists and its first index was drawn): a replay gives the
        global RNG back its live state, so the model's random stream is the one of a run that never stopped."""
        if self._live_global is not None:
            torch.set_rng_state(self._live_global)
            self._live_global = None

    def _start_pass(self) -> int:
        """Bookkeeping at the start of a pass; returns how many batches a resume asked to skip."""
        self._epoch_start_states = [g.get_state() for g in self._generators()]
        self._open_draws()
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
        return self._position_state()

    def load_state_dict(self, state: dict) -> None:
        """Resume: the next pass continues epoch `state["epoch"]` at its first unseen batch, same order."""
        self._load_position(state)

    # hasten's own position, also kept beside torchdata's state by a use_stateful_dataloader loader (whose
    # state_dict is torchdata's): checkpoint/layout.py saves it as sampler.bin.
    def _position_state(self) -> dict:
        if self._in_epoch:
            states, done, start = self._epoch_start_states, self._batches_yielded, self._epoch_start_global
        else:
            states, done = [g.get_state() for g in self._generators()], self._pending_skip
            start = self._replay_global  # a loaded state not yet replayed; between epochs the live RNG decides
        state = {
            "version": _STATE_VERSION,
            "epoch": self.iteration,
            "batches_yielded": done,
            "generator_states": [s.tolist() for s in states],
        }
        if start is not None:
            state["global_rng"] = {"state": start[0].tolist(), "worker_seed_drawn": bool(start[1])}
        sampler = get_sampler(self)
        if isinstance(sampler, SeedableRandomSampler):
            state["sampler_seed"] = sampler.initial_seed
        return state

    def _load_position(self, state: dict, within_epoch: bool = True) -> None:
        """Go back to the epoch and shuffle of `state`; with `within_epoch`, also past the batches it had yielded
        (without, the next pass replays that epoch from its first batch: what a script that skips by hand needs)."""
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
        saved_global = state.get("global_rng")
        self._replay_global = None
        if saved_global is not None and self._global_draws:
            self._replay_global = (torch.tensor(saved_global["state"], dtype=torch.uint8),
                                   bool(saved_global["worker_seed_drawn"]))
        self.iteration = int(state["epoch"])
        self._pending_skip = int(state["batches_yielded"]) if within_epoch else 0
        self._in_epoch = False
        self._batches_yielded = 0


def reject_unsupported(torch_device_mesh) -> None:
    if torch_device_mesh is not None:
        raise NotSupportedYetError(
            "Preparing a data loader for a torch device mesh (tensor/context parallelism) is not supported by "
            "hasten yet; pass torch_device_mesh=None."
        )


def carried_kwargs(dataloader) -> dict:
    return {name: getattr(dataloader, name, default) for name, default in LOADER_DEFAULTS.items()}


def without_range(items, count: int, after: int = 0):
    """`items` without the `count` items that follow the first `after` ones."""
    for position, item in enumerate(items):
        if not after <= position < after + count:
            yield item
