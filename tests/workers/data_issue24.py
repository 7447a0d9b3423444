"""Launched by tests/data/test_stateful.py on 2 processes: stateful loaders resume exactly (shard and dispatcher,
with and without workers), gather_for_metrics drops exactly the repeated rows (map-style and iterable, shard and
dispatcher), split_between_processes splits a datasets.Dataset by rows. Prints one `OK <check>` line per check."""

from __future__ import annotations

import sys
import tempfile

import torch
from torch.utils.data import DataLoader, IterableDataset

from hasten import Accelerator, DataLoaderConfiguration
from hasten.state import GradientState


class Stream(IterableDataset):
    def __init__(self, n, sized):
        self.n, self.sized = n, sized

    def __iter__(self):
        yield from (torch.tensor([float(i)]) for i in range(self.n))

    def __len__(self):
        if not self.sized:
            raise TypeError("unsized")
        return self.n


def stateful_resume(dispatch: bool, workers: int):
    GradientState._reset_state()
    torch.manual_seed(3)
    accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True,
                                                                        dispatch_batches=dispatch))
    from torchdata.stateful_dataloader import StatefulDataLoader

    data = torch.arange(64.0).unsqueeze(1)
    loader = accelerator.prepare(DataLoader(data, batch_size=4, shuffle=True, num_workers=workers))
    assert isinstance(loader, StatefulDataLoader) and isinstance(loader.base_dataloader, StatefulDataLoader)
    with tempfile.TemporaryDirectory() as folder:
        folder = accelerator.gather_for_metrics([folder], use_gather_object=True)[0]  # one folder for all ranks
        rest = []
        for i, batch in enumerate(loader):
            if i == 2:
                accelerator.save_state(folder)
            if i > 2:
                rest.append(batch)
        accelerator.load_state(folder)
        resumed = list(loader)
    assert len(resumed) == len(rest) and all(torch.equal(a, b) for a, b in zip(resumed, rest)), (
        f"rank {accelerator.process_index}: resumed {[b.flatten().tolist() for b in resumed]} "
        f"expected {[b.flatten().tolist() for b in rest]}")
    print(f"OK stateful dispatch={dispatch} workers={workers}", flush=True)


def gathered(dispatch, dataset, batch_size=4):
    GradientState._reset_state()
    accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(dispatch_batches=dispatch))
    loader = accelerator.prepare(DataLoader(dataset, batch_size=batch_size))
    rows = []
    for batch in loader:
        rows += accelerator.gather_for_metrics(batch).flatten().tolist()
    return rows


def gather_exact():
    for n in (13, 16, 10, 9):
        expected = [float(i) for i in range(n)]
        for dispatch in (None, True, False):
            for name, dataset in (("map", torch.arange(float(n)).unsqueeze(1)),
                                  ("sized stream", Stream(n, True)), ("stream", Stream(n, False))):
                if dispatch is None and name == "map":
                    continue
                rows = gathered(dispatch, dataset)
                assert rows == expected, f"n={n} dispatch={dispatch} {name}: {rows}"
    print("OK gather_for_metrics", flush=True)


def split_datasets():
    from datasets import Dataset

    from hasten import PartialState

    state = PartialState()
    rank = state.process_index
    data = Dataset.from_dict({"x": [0, 1, 2, 3], "y": [4, 5, 6, 7]})
    with state.split_between_processes(data) as share:
        assert isinstance(share, Dataset) and share["x"][:] == [2 * rank, 2 * rank + 1], share
    odd = Dataset.from_dict({"x": [0, 1, 2]})
    with state.split_between_processes(odd, apply_padding=True) as share:
        assert list(share["x"]) == ([0, 1] if rank == 0 else [2, 2]), share
    with state.split_between_processes(odd) as share:
        assert list(share["x"]) == ([0, 1] if rank == 0 else [2]), share
    print("OK split_between_processes", flush=True)


if __name__ == "__main__":
    checks = sys.argv[1:] or ["stateful", "gather", "split"]
    if "split" in checks:
        split_datasets()
    if "gather" in checks:
        gather_exact()
    if "stateful" in checks:
        for dispatch in (False, True):
            for workers in (0, 2):
                stateful_resume(dispatch, workers)
