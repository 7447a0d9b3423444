"""`use_stateful_dataloader=True`: prepared loaders that are also torchdata `StatefulDataLoader`s.

A hasten loader is itself the `DataLoader` it iterates (Accelerate wraps one). With the switch on, the loader is
built as a subclass of both its own class and `StatefulDataLoader`, so `isinstance(loader, StatefulDataLoader)`
holds, `loader.base_dataloader` is a `StatefulDataLoader`, and the position is torchdata's `state_dict()`
(worker and dataset states included, so resuming with `num_workers > 0` is exact).

The loaders read one batch (one step, for the dispatcher) ahead. torchdata's own state would then count the
batch read ahead as used, so the loader keeps a snapshot taken just before each read ahead, and `state_dict()`
returns that snapshot: the position after the batches actually handed out.
"""

from __future__ import annotations

from torch.utils.data import DataLoader

_INSTALL_HINT = ("use_stateful_dataloader=True needs torchdata >= 0.8 (its StatefulDataLoader): "
                 "pip install 'hasten[stateful]' (or 'torchdata>=0.11')")

_VARIANTS: dict = {}


def stateful_dataloader_class():
    """torchdata's `StatefulDataLoader`, imported on first use."""
    from ..core.availability import is_torchdata_stateful_dataloader_available

    if not is_torchdata_stateful_dataloader_available():
        raise ImportError(_INSTALL_HINT)
    from torchdata.stateful_dataloader import StatefulDataLoader

    return StatefulDataLoader


class StatefulPosition:
    """What changes in a loader built with `use_stateful_dataloader=True` (first base of the built class)."""

    use_stateful_dataloader = True
    _dl_state = None

    # torchdata's iterators read `_index_sampler` and fast-forward it on resume; they get the plain one (hasten's
    # skipping wrapper is for its own positions, unused here).
    @property
    def _index_sampler(self):
        return DataLoader._index_sampler.fget(self)

    def _start_pass(self) -> int:
        super()._start_pass()
        return 0  # a restored position lives in torchdata's iterator, not in a count of batches to skip

    def _snapshot(self, finished: bool = False) -> None:
        """Record the position after the batches handed out so far (called before each read ahead)."""
        state = _stateful_base(self).state_dict(self)
        state["_iterator_finished"] = bool(finished)
        self._dl_state = state

    def state_dict(self) -> dict:
        """torchdata's state of this loader, as of the last batch handed out."""
        if self._dl_state is None:
            return _stateful_base(self).state_dict(self)
        return self._dl_state

    def load_state_dict(self, state_dict: dict) -> None:
        """Continue from `state_dict` (one of this loader's, or a `StatefulDataLoader`'s) on the next pass."""
        _stateful_base(self).load_state_dict(self, state_dict)
        self._dl_state = state_dict


def _stateful_base(loader):
    return type(loader)._torchdata_loader


def stateful_variant(cls):
    """`cls` made a `StatefulDataLoader` too; one class per `cls`, registered here by name so it pickles."""
    variant = _VARIANTS.get(cls)
    if variant is None:
        base = stateful_dataloader_class()
        name = f"Stateful{cls.__name__}"
        variant = type(cls.__name__, (StatefulPosition, cls, base),
                       {"__module__": __name__, "__qualname__": name, "_torchdata_loader": base})
        globals()[name] = variant
        _VARIANTS[cls] = variant
    return variant


class StatefulSwitch:
    """`SomeLoader(..., use_stateful_dataloader=True)` builds the stateful variant of `SomeLoader`."""

    def __new__(cls, *args, use_stateful_dataloader: bool = False, **kwargs):
        built = stateful_variant(cls) if use_stateful_dataloader and not issubclass(cls, StatefulPosition) else cls
        return super().__new__(built)
