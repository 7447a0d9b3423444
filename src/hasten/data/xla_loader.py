"""A prepared loader on the XLA device: torch_xla's `MpDeviceLoader` uploads the batches in background threads,
and this wrapper keeps the loader's position (`end_of_dataloader`, `remainder`) true for the batch the training
thread holds.

Why a wrapper of our own around `MpDeviceLoader`: its worker thread reads the loader ahead of the training
thread, so the loader's own flags describe a batch that is still in the queue. Accelerate reads them there, and
its training thread never sees the end of the loader: `accumulate()` misses the last-batch sync and
`gather_for_metrics` keeps the padding (docs/differences.md). Here each batch carries its own position through a
queue beside the batches (same order: one reader thread, one upload thread), and the wrapper is the loader that
`GradientState` watches. The wrapped loader's attributes (`dataset`, `sampler`, `set_epoch`, `state_dict`...)
are reached through the wrapper, so `save_state` and `skip_first_batches` see a loader.
"""

from __future__ import annotations

import collections
import importlib

from .resumable import DataLoaderStateMixin


def _state_dicts() -> list:
    """The training thread's Borg dicts of the process-wide states (the loader thread reads them as its own)."""
    from ..state import AcceleratorState, PartialState

    return [(cls, cls._shared_state) for cls in (PartialState, AcceleratorState)]


def _adopt(states: list) -> None:
    """In a loader thread: see the training thread's PartialState/AcceleratorState. GradientState stays this
    thread's own, so the wrapped loader's begin/end do not become the loader the training thread watches."""
    for cls, shared in states:
        holder = cls.__dict__.get("_shared_state")
        if hasattr(holder, "_storage"):  # per-thread dicts (state.ThreadLocalSharedDict)
            holder._storage = shared


class _WithPositions:
    """The wrapped loader as MpDeviceLoader's worker thread iterates it, noting each batch's position."""

    def __init__(self, loader, positions: collections.deque, states: list):
        self._loader, self._positions, self._states = loader, positions, states

    def __len__(self):
        return len(self._loader)

    def __iter__(self):
        _adopt(self._states)
        for batch in self._loader:
            self._positions.append((self._loader.end_of_dataloader, self._loader.remainder))
            yield batch


class XLADeviceLoader(DataLoaderStateMixin):
    """`loader`'s batches on the XLA `device`, uploaded ahead by `MpDeviceLoader(**loader_kwargs)`."""

    def __init__(self, loader, device, **loader_kwargs):
        self._loader = loader
        self.device = device
        self._loader_kwargs = loader_kwargs
        # The RNG synchronisation at the start of a pass is a collective: it runs here, in the training thread.
        self._rng_types = getattr(loader, "rng_types", None)
        if self._rng_types:
            loader.rng_types = None

    def __getattr__(self, name):
        if name.startswith("__") or name == "_loader":
            raise AttributeError(name)
        return getattr(self._loader, name)

    def __len__(self):
        return len(self._loader)

    @property
    def dataloader(self):
        """Accelerate's `MpDeviceLoaderWrapper.dataloader`: the loader this one uploads from."""
        return self._loader

    @property
    def base_dataloader(self):
        return self._loader

    def __iter__(self):
        from ..distributed.rng import synchronize_rng_states
        from ..state import GradientState

        parallel_loader = importlib.import_module("torch_xla.distributed.parallel_loader")
        if self._rng_types:
            synchronize_rng_states(self._rng_types, getattr(self._loader, "synchronized_generator", None))
        positions = collections.deque()
        source = _WithPositions(self._loader, positions, _state_dicts())
        self.reset()
        GradientState()._add_dataloader(self)
        try:
            for batch in parallel_loader.MpDeviceLoader(source, self.device, **self._loader_kwargs):
                self.end_of_dataloader, self.remainder = positions.popleft()
                yield batch
        finally:
            GradientState()._remove_dataloader(self)
