"""`DataLoaderAdapter` (Accelerate's `accelerate.data_loader.DataLoaderAdapter`): one object in front of either a
torch `DataLoader` or a torchdata `StatefulDataLoader`, passing for the loader it wraps."""

from __future__ import annotations

from torch.utils.data import DataLoader

from ..state import PartialState


class DataLoaderAdapter:
    """Builds `DataLoader(dataset, batch_sampler=batch_sampler, **kwargs)` (a torchdata `StatefulDataLoader` with
    `use_stateful_dataloader=True`) and stands in for it: attributes, `len()` and iteration go to the wrapped
    loader, and `isinstance(adapter, DataLoader)` holds, as code written for plain loaders expects.
    """

    def __init__(self, dataset, use_stateful_dataloader: bool = False, batch_sampler=None, **kwargs):
        self.use_stateful_dataloader = use_stateful_dataloader
        if use_stateful_dataloader:
            from ..core.availability import is_torchdata_stateful_dataloader_available

            if not is_torchdata_stateful_dataloader_available():
                raise ImportError("use_stateful_dataloader=True needs torchdata >= 0.8: pip install 'torchdata>=0.8'")
            from torchdata.stateful_dataloader import StatefulDataLoader

            self.base_dataloader = StatefulDataLoader(dataset, batch_sampler=batch_sampler, **kwargs)
        else:
            self.base_dataloader = DataLoader(dataset, batch_sampler=batch_sampler, **kwargs)
        self.dl_state_dict = self.base_dataloader.state_dict() if use_stateful_dataloader else None

    def __getattr__(self, name):
        if name == "base_dataloader":  # not built yet (failed __init__, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.base_dataloader, name)

    @property
    def __class__(self):
        return self.base_dataloader.__class__

    def __len__(self):
        return len(self.base_dataloader)

    def __iter__(self):
        return iter(self.base_dataloader)

    def state_dict(self):
        """The position in the data, as last snapshotted (a `StatefulDataLoader`'s state)."""
        if not self.use_stateful_dataloader:
            raise AttributeError("this DataLoaderAdapter wraps a plain DataLoader, which has no state_dict; "
                                 "create it with use_stateful_dataloader=True to checkpoint its position")
        return self.dl_state_dict

    def load_state_dict(self, state_dict) -> None:
        if not self.use_stateful_dataloader:
            raise AttributeError("this DataLoaderAdapter wraps a plain DataLoader, which cannot load a state; "
                                 "create it with use_stateful_dataloader=True")
        self.base_dataloader.load_state_dict(state_dict)
        self.dl_state_dict = state_dict

    def adjust_state_dict_for_prefetch(self) -> None:
        """Correct the snapshot for the batches each other process fetched ahead (one each, `num_processes - 1`
        in all), so that a resume does not skip them."""
        state = PartialState()
        if state.num_processes == 1 or not self.dl_state_dict:
            return
        ahead = state.num_processes - 1
        for key in ("_sampler_iter_yielded", "_num_yielded"):
            if self.dl_state_dict.get(key, 0) > 0:
                self.dl_state_dict[key] -= ahead
        sampler_state = self.dl_state_dict.get("_index_sampler_state")
        if isinstance(sampler_state, dict) and sampler_state.get("samples_yielded", 0) > 0:
            sampler_state["samples_yielded"] -= (self.base_dataloader.batch_size or 1) * ahead

    def _update_state_dict(self) -> None:
        if self.use_stateful_dataloader:
            self.dl_state_dict = self.base_dataloader.state_dict()
            self.adjust_state_dict_for_prefetch()
            self.dl_state_dict["_iterator_finished"] = bool(getattr(self, "end_of_dataloader", False))
