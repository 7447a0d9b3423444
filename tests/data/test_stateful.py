"""use_stateful_dataloader=True (hasten/data/stateful.py), exact gather_for_metrics on the last batch and
split_between_processes on a datasets.Dataset (issue 24). One launch covers the 2-process checks."""

from __future__ import annotations

from unittest import mock

import pytest
import torch

from hasten import Accelerator, DataLoaderConfiguration
from hasten.data_loader import (
    DataLoaderDispatcher,
    DataLoaderShard,
    DataLoaderStateMixin,
    SkipDataLoader,
)
from hasten.state import GradientState
from tests.launching import launch

torchdata = pytest.importorskip("torchdata.stateful_dataloader")
StatefulDataLoader = torchdata.StatefulDataLoader

pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")

LOADERS = (SkipDataLoader, DataLoaderShard, DataLoaderDispatcher)


@pytest.fixture(autouse=True)
def _fresh_gradient_state():
    GradientState._reset_state()
    yield
    GradientState._reset_state()


def _rows(batches):
    return [b.tolist() for b in batches]


def _same(a, b) -> bool:
    """Equality of nested states that hold tensors (a shuffle generator's state)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("cls", LOADERS)
def test_built_as_a_stateful_dataloader(cls):
    loader = cls(list(range(12)), batch_size=4, use_stateful_dataloader=True)
    assert loader.use_stateful_dataloader and isinstance(loader, cls) and isinstance(loader, DataLoaderStateMixin)
    assert isinstance(loader, StatefulDataLoader) and isinstance(loader.base_dataloader, StatefulDataLoader)
    assert type(loader).__name__ == cls.__name__
    plain = cls(list(range(12)), batch_size=4)
    assert not plain.use_stateful_dataloader and not isinstance(plain, StatefulDataLoader)


def test_skip_data_loader_and_end_of_dataloader():
    skip = SkipDataLoader(list(range(12)), batch_size=4, skip_batches=1, use_stateful_dataloader=True)
    assert _rows(skip) == [[4, 5, 6, 7], [8, 9, 10, 11]]
    for cls in (DataLoaderShard, DataLoaderDispatcher):
        loader = cls(list(range(12)), batch_size=4, use_stateful_dataloader=True)
        for _ in range(2):
            assert [loader.end_of_dataloader for _ in loader] == [False, False, True]


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("cls", [DataLoaderShard, DataLoaderDispatcher])
def test_state_dict_resumes_after_the_batches_handed_out(cls, workers):
    loader = cls(list(range(20)), batch_size=4, use_stateful_dataloader=True, num_workers=workers)
    seen = []
    for i, batch in enumerate(loader):
        seen.append(batch)
        if i == 1:
            state = loader.state_dict()  # the loader has read batch 2 ahead already: it must not count
    again = cls(list(range(20)), batch_size=4, use_stateful_dataloader=True, num_workers=workers)
    again.load_state_dict(state)
    assert again.state_dict() is state
    assert _rows(again) == _rows(seen[2:])
    finished = loader.state_dict()
    assert finished["_iterator_finished"] is True


@pytest.mark.parametrize("workers", [0, 2])
def test_same_state_as_torchdata_itself(workers):
    """The state of every loader equals a plain StatefulDataLoader's after the same batches, and loads into it."""
    Accelerator()
    def seeded():
        return torch.Generator().manual_seed(5)
    data = list(range(40))
    reference = StatefulDataLoader(data, batch_size=4, shuffle=True, num_workers=workers, generator=seeded())
    ours = [cls(data, batch_size=4, shuffle=True, num_workers=workers, generator=seeded(),
                use_stateful_dataloader=True) for cls in LOADERS]

    def take(loader, n):
        out = []
        for batch in loader:
            out.append(batch)
            if len(out) == n:
                if hasattr(loader, "end"):
                    loader.end()  # leaving the pass early
                break
        return out

    expected = _rows(take(reference, 4))
    for loader in ours:
        assert _rows(take(loader, 4)) == expected
    state = reference.state_dict()
    for loader in ours:
        assert _same(loader.state_dict(), state), type(loader).__name__
    follow = StatefulDataLoader(data, batch_size=4, shuffle=True, num_workers=workers, generator=seeded())
    follow.load_state_dict(state)
    rest = _rows(follow)
    for cls in LOADERS:
        fresh = cls(data, batch_size=4, shuffle=True, num_workers=workers, generator=seeded(),
                    use_stateful_dataloader=True)
        fresh.load_state_dict(ours[0].state_dict())
        assert _rows(fresh) == rest, cls.__name__
    assert GradientState().active_dataloader is None


def test_save_state_writes_accelerates_file_and_resumes(tmp_path):
    accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True))
    assert accelerator.use_stateful_dataloader
    model = accelerator.prepare(torch.nn.Linear(1, 1))
    loader = accelerator.prepare(torch.utils.data.DataLoader(torch.arange(24.0).unsqueeze(1), batch_size=4,
                                                             shuffle=True))
    assert isinstance(loader, StatefulDataLoader) and model is not None
    rest = []
    for i, batch in enumerate(loader):
        if i == 1:
            folder = accelerator.save_state(tmp_path / "ckpt")
        elif i > 1:
            rest.append(batch)
    names = {p.name for p in (tmp_path / "ckpt").iterdir()}
    assert {"dl_state_dict.bin", "sampler.bin"} <= names
    saved = torch.load(tmp_path / "ckpt" / "dl_state_dict.bin", weights_only=False)
    assert saved["_num_yielded"] == 2
    accelerator.load_state(folder)
    assert _rows(loader) == _rows(rest)


def test_missing_torchdata_names_the_extra():
    from hasten.data import stateful

    with mock.patch("hasten.core.availability.is_torchdata_stateful_dataloader_available", return_value=False), \
            mock.patch.dict(stateful._VARIANTS, clear=True), \
            pytest.raises(ImportError, match=r"hasten\[stateful\]"):  # as in a process that never built one
        DataLoaderShard(list(range(4)), batch_size=2, use_stateful_dataloader=True)


def test_two_processes():
    """2 gloo processes: stateful save_state/load_state resumes exactly (shard and dispatcher, 0 and 2 workers);
    gather_for_metrics returns exactly the dataset (map-style, sized and unsized streams; shard and dispatcher);
    split_between_processes gives each process its rows of a datasets.Dataset."""
    pytest.importorskip("datasets")
    out = launch("data_issue24.py", timeout=300).stdout
    for check in ("split_between_processes", "gather_for_metrics", "stateful dispatch=False workers=0",
                  "stateful dispatch=False workers=2", "stateful dispatch=True workers=0",
                  "stateful dispatch=True workers=2"):
        assert out.count(f"OK {check}") == 2, f"{check} missing from\n{out}"  # lines of two ranks may interleave


def test_prepare_data_loader_builds_a_stateful_loader_when_asked():
    from torch.utils.data import DataLoader

    from hasten.data_loader import prepare_data_loader

    stateful = prepare_data_loader(DataLoader(list(range(12)), batch_size=4), num_processes=1, process_index=0,
                                   put_on_device=False, use_stateful_dataloader=True)
    assert isinstance(stateful, StatefulDataLoader) and stateful.use_stateful_dataloader
    next(iter(stateful))
    assert stateful.state_dict()  # torchdata's state, resumable
    plain = prepare_data_loader(DataLoader(list(range(12)), batch_size=4), num_processes=1, process_index=0,
                                put_on_device=False)
    assert not isinstance(plain, StatefulDataLoader)
