"""Data loading: sharding rules (one process, explicit ranks), prepared loaders, resume, and 2-process runs."""

import json

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler, Sampler, SequentialSampler

from hasten.data_loader import (
    BatchSamplerShard,
    DataLoaderDispatcher,
    DataLoaderShard,
    DataLoaderStateMixin,
    IterableDatasetShard,
    SeedableRandomSampler,
    SkipBatchSampler,
    SkipDataLoader,
    gather_for_metrics,
    get_sampler,
    prepare_data_loader,
    skip_first_batches,
)
from hasten.state import GradientState
from launching import launch


class Stream(IterableDataset):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(range(self.n))

    def __len__(self):
        return self.n


def batches(n, batch_size, drop_last=False):
    return BatchSampler(SequentialSampler(range(n)), batch_size, drop_last)


def shards(sampler, num_processes=2, **kwargs):
    return [list(BatchSamplerShard(sampler, num_processes, rank, **kwargs)) for rank in range(num_processes)]


def rows(loader):
    return [batch.tolist() for batch in loader]


# -- BatchSamplerShard -----------------------------------------------------------------------------------------

def test_batch_sampler_shard_matches_the_reference_layouts():
    assert shards(batches(9, 2)) == [[[0, 1], [4, 5], [8, 0]], [[2, 3], [6, 7], [1, 2]]]
    assert shards(batches(9, 2), even_batches=False) == [[[0, 1], [4, 5], [8]], [[2, 3], [6, 7]]]
    assert shards(batches(9, 2), split_batches=True) == [[[0], [2], [4], [6], [8]], [[1], [3], [5], [7], [0]]]
    assert shards(batches(9, 2, drop_last=True)) == [[[0, 1], [4, 5]], [[2, 3], [6, 7]]]
    # A short last batch in a complete round is completed from the start of the epoch.
    assert shards(batches(7, 2)) == [[[0, 1], [4, 5]], [[2, 3], [6, 0]]]
    assert shards(batches(10, 4)) == [[[0, 1, 2, 3], [8, 9, 0, 1]], [[4, 5, 6, 7], [2, 3, 4, 5]]]


@pytest.mark.parametrize("num_processes", [2, 3])
@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("even", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
def test_batch_sampler_shard_lengths_and_coverage(num_processes, split, even, drop_last):
    batch_size = 6
    for n in range(1, 40):
        sampler = batches(n, batch_size, drop_last)
        per_rank = shards(sampler, num_processes, split_batches=split, even_batches=even)
        for rank, got in enumerate(per_rank):
            assert len(BatchSamplerShard(sampler, num_processes, rank, split, even)) == len(got), (n, rank)
        seen = [i for got in per_rank for batch in got for i in batch]
        expected = [i for batch in sampler for i in batch]
        if drop_last:  # incomplete rounds are dropped; nothing is repeated
            assert set(seen) <= set(expected) and len(seen) == len(set(seen)), n
            continue
        assert set(seen) == set(expected), n
        if even:
            assert len({len(got) for got in per_rank}) == 1  # same number of batches everywhere
            full = batch_size // num_processes if split else batch_size
            assert all(len(batch) == full for got in per_rank for batch in got)  # all full-size
        else:
            assert sorted(seen) == sorted(expected)  # nothing repeated


def test_batch_sampler_shard_with_varying_batch_sizes_redeals_whole_batches():
    varying = [[0], [1, 2], [3, 4, 5]]
    assert shards(varying) == [[[0], [3, 4, 5]], [[1, 2], [0]]]
    assert shards(varying, even_batches=False) == [[[0], [3, 4, 5]], [[1, 2]]]


def test_batch_sampler_shard_rejects_bad_splits():
    with pytest.raises(ValueError, match="divisible by 2") as refused:
        BatchSamplerShard(batches(10, 3), 2, 0, split_batches=True)
    # Accelerate's words first: code matches them
    assert str(refused.value).startswith("To use `BatchSamplerShard` in `split_batches` mode, the batch size (3) "
                                         "needs to be a round multiple of the number of processes (2)")
    with pytest.raises(ValueError, match="batch size"):
        BatchSamplerShard([[0, 1]], 2, 0, split_batches=True)
    with pytest.raises(ValueError, match="process_index=2"):
        BatchSamplerShard(batches(10, 2), 2, 2)


# -- IterableDatasetShard, SeedableRandomSampler, SkipBatchSampler -----------------------------------------------

def test_iterable_dataset_shard():
    per_rank = [list(IterableDatasetShard(Stream(9), 2, num_processes=2, process_index=r)) for r in range(2)]
    assert per_rank == [[0, 1, 4, 5, 8, 0], [2, 3, 6, 7, 1, 2]]
    assert len(IterableDatasetShard(Stream(9), 2, num_processes=2)) == 6
    dropped = [list(IterableDatasetShard(Stream(9), 2, True, 2, r)) for r in range(2)]
    assert dropped == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert len(IterableDatasetShard(Stream(9), 2, True, 2)) == 4
    split = [list(IterableDatasetShard(Stream(5), 2, False, 2, r, split_batches=True)) for r in range(2)]
    assert split == [[0, 2, 4], [1, 3, 0]]
    assert len(IterableDatasetShard(Stream(5), 2, False, 2, 0, split_batches=True)) == 3
    with pytest.raises(ValueError, match="divisible"):
        IterableDatasetShard(Stream(5), 3, num_processes=2, split_batches=True)


def test_iterable_dataset_shard_reseeds_a_dataset_generator_with_the_epoch():
    class Shuffled(IterableDataset):
        def __init__(self):
            self.generator = torch.Generator()

        def __iter__(self):
            return iter(torch.randperm(8, generator=self.generator).tolist())

    shard = IterableDatasetShard(Shuffled(), 2)
    first, again = list(shard), list(shard)
    assert first == again
    shard.set_epoch(1)
    assert list(shard) != first


def test_seedable_random_sampler_depends_only_on_seed_and_epoch():
    a = SeedableRandomSampler(range(20), data_seed=3)
    b = SeedableRandomSampler(range(20), data_seed=3)
    first = list(a)
    assert first == list(b) and sorted(first) == list(range(20))
    assert a.epoch == 1 and list(a) != first
    a.set_epoch(0)
    assert list(a) == first
    assert SeedableRandomSampler(range(5)).initial_seed == torch.random.initial_seed()


def test_skip_batch_sampler():
    skipping = SkipBatchSampler(batches(10, 3), skip_batches=2)
    assert list(skipping) == [[6, 7, 8], [9]]
    assert len(skipping) == 2 and skipping.total_length == 4


# -- prepare_data_loader in one process ------------------------------------------------------------------------

def test_prepared_loader_is_a_dataloader_and_keeps_batches():
    plain = DataLoader(list(range(10)), batch_size=3, collate_fn=lambda b: torch.tensor(b) * 10)
    loader = prepare_data_loader(plain)
    assert isinstance(loader, DataLoader) and isinstance(loader, DataLoaderShard)
    assert rows(loader) == [[0, 10, 20], [30, 40, 50], [60, 70, 80], [90]]
    assert len(loader) == 4 and loader.collate_fn is plain.collate_fn


def test_prepare_with_explicit_ranks_shards_without_a_process_group():
    per_rank = [rows(prepare_data_loader(DataLoader(list(range(9)), batch_size=2), num_processes=2,
                                         process_index=rank)) for rank in range(2)]
    assert per_rank == [[[0, 1], [4, 5], [8, 0]], [[2, 3], [6, 7], [1, 2]]]
    stream = [rows(prepare_data_loader(DataLoader(Stream(9), batch_size=4), num_processes=2, process_index=rank,
                                       split_batches=True)) for rank in range(2)]
    assert stream == [[[0, 1], [4, 5], [8, 0]], [[2, 3], [6, 7], [1, 2]]]


def test_a_batch_sampler_given_as_sampler_is_sharded_too():
    class Indexable:
        def __len__(self):
            return 9

        def __getitem__(self, indices):
            return torch.tensor(indices)

    sampler = BatchSampler(SequentialSampler(range(9)), 2, False)
    per_rank = [prepare_data_loader(DataLoader(Indexable(), sampler=sampler, batch_size=None), num_processes=2,
                                    process_index=rank) for rank in range(2)]
    assert [rows(loader) for loader in per_rank] == [[[0, 1], [4, 5], [8, 0]], [[2, 3], [6, 7], [1, 2]]]
    assert per_rank[0].total_batch_size == 4 and per_rank[0].base_dataloader is per_rank[0]
    assert rows(skip_first_batches(per_rank[1], 2)) == [[1, 2]]


def test_put_on_device_moves_batches():
    loader = prepare_data_loader(DataLoader([{"x": torch.ones(2)}] * 3, batch_size=2), device=torch.device("meta"),
                                 put_on_device=True)
    assert {batch["x"].device.type for batch in loader} == {"meta"}
    assert isinstance(prepare_data_loader(DataLoader(Stream(4)), put_on_device=True), DataLoaderDispatcher)


def test_bad_arguments_get_clear_errors():
    loader = DataLoader(list(range(10)), batch_size=3)
    with pytest.raises(ValueError, match="divisible by 2"):
        prepare_data_loader(loader, num_processes=2, process_index=0, split_batches=True)
    with pytest.raises(ValueError, match="needs a batch size"):
        prepare_data_loader(DataLoader(list(range(4)), batch_size=None), split_batches=True)
    with pytest.raises(ValueError, match="put_on_device=True"):
        prepare_data_loader(loader, dispatch_batches=True)
    with pytest.raises(ValueError, match="torch_device_mesh must be a torch DeviceMesh"):  # a mesh: issue 14
        prepare_data_loader(loader, torch_device_mesh=object())
    with pytest.raises(ValueError, match="process_index=3"):
        prepare_data_loader(loader, num_processes=2, process_index=3)
    with pytest.raises(ValueError, match="torch.utils.data.DataLoader"):
        prepare_data_loader([1, 2, 3])


def test_generator_rng_type_dropped_without_a_synchronised_generator():
    loader = prepare_data_loader(DataLoader(list(range(4)), batch_size=2), rng_types=["generator", "torch"])
    assert loader.rng_types == ["torch"]
    # Processes that read their own shares get a shared shuffle generator, kept in step by "generator".
    shuffled = prepare_data_loader(DataLoader(list(range(4)), batch_size=2, shuffle=True), rng_types=["generator"],
                                   num_processes=2, process_index=0)
    assert shuffled.rng_types == ["generator"] and shuffled.synchronized_generator is get_sampler(shuffled).generator
    # One process: as in Accelerate the sampler keeps drawing from the global RNG, nothing to synchronise.
    alone = prepare_data_loader(DataLoader(list(range(4)), batch_size=2, shuffle=True), rng_types=["generator"])
    assert alone.rng_types == [] and get_sampler(alone).generator is None


def test_seedable_sampler_is_installed_without_touching_the_users_loader():
    plain = DataLoader(list(range(8)), batch_size=2, shuffle=True)
    loader = prepare_data_loader(plain, use_seedable_sampler=True, data_seed=11)
    assert isinstance(get_sampler(loader), SeedableRandomSampler) and get_sampler(loader).initial_seed == 11
    assert type(get_sampler(plain)) is RandomSampler
    loader.set_epoch(4)
    first = rows(loader)
    loader.set_epoch(4)
    assert rows(loader) == first


def test_set_epoch_reaches_the_sampler():
    class EpochSampler(Sampler):
        def __init__(self):
            self.epochs = []

        def set_epoch(self, epoch):
            self.epochs.append(epoch)

        def __iter__(self):
            return iter(range(4))

        def __len__(self):
            return 4

    sampler = EpochSampler()
    loader = prepare_data_loader(DataLoader(list(range(4)), batch_size=2, sampler=sampler), num_processes=2,
                                 process_index=1)
    loader.set_epoch(5)
    assert sampler.epochs[-1] == 5 and loader.iteration == 5
    rows(loader)
    rows(loader)
    assert sampler.epochs[-2:] == [5, 6]  # each pass announces its epoch


def _orders_and_probe(make, epochs=3):
    torch.manual_seed(5)
    loader = make()
    orders = [rows(loader) for _ in range(epochs)]
    return orders, torch.rand(3)


@pytest.mark.parametrize("kwargs", [
    {"shuffle": True},
    {"shuffle": True, "num_workers": 2},
    {"shuffle": True, "num_workers": 2, "persistent_workers": True},
    {"sampler": "weighted"},
    {},
])
def test_default_draws_from_the_global_rng_as_a_plain_torch_loader(kwargs, monkeypatch):
    """One process, default: every epoch's order and the global torch RNG afterwards are those of the same plain
    torch DataLoader under the same seed (Accelerate leaves such a loader's sampler and generator alone)."""
    monkeypatch.delenv("HASTEN_DATA_OWN_RNG", raising=False)

    def plain():
        extra = dict(kwargs)
        if extra.pop("sampler", None):
            extra["sampler"] = torch.utils.data.WeightedRandomSampler([1.0] * 11, 11)
        return DataLoader(list(range(11)), batch_size=3, **extra)

    expected = _orders_and_probe(plain)
    got = _orders_and_probe(lambda: prepare_data_loader(plain(), rng_types=["generator"]))
    assert got[0] == expected[0] and torch.equal(got[1], expected[1])
    if kwargs:
        assert got[0][0] != got[0][1]  # a new order every epoch


@pytest.mark.parametrize("kwargs", [{"num_processes": 1}, {"num_processes": 2, "process_index": 1},
                                    {"put_on_device": True, "dispatch_batches": True}])
def test_data_own_rng_never_touches_the_global_rng(kwargs, monkeypatch):
    """hasten setting data_own_rng (HASTEN_DATA_OWN_RNG=1): every prepared loader has generators of its own,
    seeded once at prepare, so iterating draws nothing from the global torch RNG; each epoch is still new."""
    monkeypatch.setenv("HASTEN_DATA_OWN_RNG", "1")
    loader = prepare_data_loader(DataLoader(list(range(10)), batch_size=3, shuffle=True), **kwargs)
    before = torch.get_rng_state()
    first, second = rows(loader), rows(loader)
    assert torch.equal(before, torch.get_rng_state())
    assert first != second
    monkeypatch.setenv("HASTEN_DATA_OWN_RNG", "0")
    loader = prepare_data_loader(DataLoader(list(range(10)), batch_size=3, shuffle=True), **kwargs)
    before = torch.get_rng_state()
    rows(loader)
    assert not torch.equal(before, torch.get_rng_state())  # the default draws from it, as Accelerate


def test_data_own_rng_reaches_the_processes_from_the_flag_and_the_config_file(tmp_path, monkeypatch):
    from hasten.commands.launch import launch_command_parser, plan_launch

    monkeypatch.delenv("HASTEN_DATA_OWN_RNG", raising=False)
    config = tmp_path / "own_rng.yaml"
    config.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: 'NO'\ndata_own_rng: true\n")
    for argv in (["--data_own_rng", "train.py"], ["--config_file", str(config), "train.py"]):
        plan = plan_launch(launch_command_parser().parse_args(argv))
        assert plan.env["HASTEN_DATA_OWN_RNG"] in ("1", "true", "True"), argv


def test_seedable_sampler_shuffle_ignores_the_global_rng_but_the_worker_seed_draws_from_it():
    """use_seedable_sampler=True (Accelerate's switch): the order comes from data_seed + epoch only, while the
    iterator still draws its worker seed from the global RNG, as a plain torch loader does."""
    def make():
        return prepare_data_loader(DataLoader(list(range(10)), batch_size=3, shuffle=True),
                                   use_seedable_sampler=True, data_seed=3)

    torch.manual_seed(1)
    first = rows(make())
    torch.manual_seed(2)
    assert rows(make()) == first
    torch.manual_seed(1)
    rows(make())
    after = torch.rand(2)
    torch.manual_seed(1)
    torch.empty((), dtype=torch.int64).random_()  # the one worker-seed draw of a pass
    assert torch.equal(torch.rand(2), after)


# -- GradientState integration ----------------------------------------------------------------------------------

def test_end_of_dataloader_and_remainder_follow_the_last_batch():
    loader = prepare_data_loader(DataLoader(list(range(7)), batch_size=3))
    assert isinstance(loader, DataLoaderStateMixin)
    seen = []
    for _ in loader:
        state = GradientState()
        seen.append((state.in_dataloader, state.end_of_dataloader, state.remainder))
    assert seen == [(True, False, 1), (True, False, 1), (True, True, 1)]
    assert not GradientState().in_dataloader and GradientState().remainder == -1


def test_breaking_out_unregisters_and_nested_loaders_stack():
    outer = prepare_data_loader(DataLoader(list(range(6)), batch_size=2))
    inner = prepare_data_loader(DataLoader(list(range(2)), batch_size=1))
    for _ in outer:
        for _ in inner:
            assert GradientState().active_dataloader is inner
        assert GradientState().active_dataloader is outer
        break
    assert not GradientState().in_dataloader


def test_gather_for_metrics_in_one_process_returns_the_input():
    loader = prepare_data_loader(DataLoader(list(range(5)), batch_size=2))
    gathered = [gather_for_metrics(batch).tolist() for batch in loader]
    assert gathered == [[0, 1], [2, 3], [4]]
    assert gather_for_metrics({"a": ["x"]}) == {"a": ["x"]}
    assert gather_for_metrics([1, 2], use_gather_object=True) == [1, 2]


# -- skip_first_batches ----------------------------------------------------------------------------------------

def test_skip_first_batches():
    loader = prepare_data_loader(DataLoader(list(range(10)), batch_size=3))
    skipped = skip_first_batches(loader, 2)
    assert type(skipped) is DataLoaderShard and rows(skipped) == [[6, 7, 8], [9]] and len(skipped) == 2
    plain = skip_first_batches(DataLoader(list(range(10)), batch_size=3), 3)
    assert type(plain) is DataLoader and rows(plain) == [[9]]
    stream = skip_first_batches(DataLoader(Stream(10), batch_size=3), 1)
    assert type(stream) is SkipDataLoader and rows(stream) == [[3, 4, 5], [6, 7, 8], [9]]
    shard = skip_first_batches(prepare_data_loader(DataLoader(Stream(10), batch_size=3)), 3)
    assert rows(shard) == [[9]]


class _EpochBatchSampler(BatchSampler):
    """A user batch sampler that reshuffles per epoch itself, over a sampler that also keeps an epoch."""

    def __init__(self, sampler, batch_size):
        super().__init__(sampler, batch_size, drop_last=False)
        self.epoch = 0

    def set_epoch(self, epoch):
        self.epoch = epoch


@pytest.mark.parametrize("dispatch", [False, True])
def test_set_epoch_reaches_the_batch_sampler_and_the_sampler_under_it(dispatch):
    sampler = SeedableRandomSampler(list(range(16)), data_seed=3)
    batch_sampler = _EpochBatchSampler(sampler, 4)
    loader = prepare_data_loader(DataLoader(list(range(16)), batch_sampler=batch_sampler), put_on_device=dispatch,
                                 dispatch_batches=dispatch)
    loader.set_epoch(1)
    assert batch_sampler.epoch == 1 and sampler.epoch == 1
    # Resuming in epoch 1 keeps epoch 1's shuffle: the skipped loader must not start the sampler at epoch 0.
    expected = rows(loader)[2:]
    loader.set_epoch(1)
    skipped = skip_first_batches(loader, 2)
    assert rows(skipped) == expected and sampler.epoch == 2


def test_base_dataloader_and_gradient_state_of_the_loaders():
    shard = prepare_data_loader(DataLoader(list(range(8)), batch_size=2))
    skip = skip_first_batches(DataLoader(Stream(8), batch_size=2), 1)
    for loader in (shard, skip, DataLoaderDispatcher(list(range(8)), batch_size=2)):
        assert loader.base_dataloader is loader and isinstance(loader.base_dataloader, DataLoader)
        assert isinstance(loader.gradient_state, GradientState)
    with pytest.raises(AttributeError):
        DataLoaderShard.base_dataloader  # noqa: B018 - an instance attribute, as in Accelerate


def test_a_half_iterated_prepared_loader_is_freed_with_its_owner():
    import gc
    import weakref

    from hasten import Accelerator

    gc.collect()
    gc.disable()  # freed by reference counting alone: no cycle may hold the loader or the accelerator
    try:
        accelerator = Accelerator(cpu=True)
        loader = accelerator.prepare_data_loader(DataLoader(list(range(8)), batch_size=2))
        iterator = iter(loader)
        assert next(iterator).tolist() == [0, 1] and GradientState().active_dataloader is loader
        refs = [weakref.ref(accelerator), weakref.ref(loader), weakref.ref(loader.gradient_state)]
        del accelerator, loader, iterator
        assert [ref() for ref in refs] == [None, None, None]
        assert GradientState().active_dataloader is None
    finally:
        gc.enable()


def test_dispatched_batches_carry_plain_values_beside_tensors():
    def tagged(samples):
        return {"source": "wiki", "x": torch.tensor(samples), "pair": (torch.tensor(samples) * 2, None)}

    loader = prepare_data_loader(DataLoader(Stream(6), batch_size=4, collate_fn=tagged), put_on_device=True)
    assert type(loader) is DataLoaderDispatcher
    got = [(b["source"], b["x"].tolist(), b["pair"][0].tolist(), b["pair"][1]) for b in loader]
    assert got == [("wiki", [0, 1, 2, 3], [0, 2, 4, 6], None), ("wiki", [4, 5], [8, 10], None)]


@pytest.mark.parametrize("collate, message", [
    (None, "holds no tensor"),  # strings collate into a list of strings
    (lambda samples: {"names": [str(s) for s in samples], "x": torch.tensor(samples)}, "per-sample str"),
    (lambda samples: {"name": "no tensors"}, "holds no tensor"),
    (lambda samples: (torch.tensor(samples), list(samples)), "per-sample int"),
])
def test_dispatcher_refuses_values_it_cannot_slice(collate, message):
    data = ["a", "b", "c"] if collate is None else list(range(3))
    loader = prepare_data_loader(DataLoader(data, batch_size=2, collate_fn=collate), put_on_device=True,
                                 dispatch_batches=True)
    with pytest.raises(ValueError, match=message):
        rows(loader)


# -- exact resume ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs", [
    {},
    {"use_seedable_sampler": True},
    {"num_workers": 1, "persistent_workers": True},
    {"own_rng": True},
    {"own_rng": True, "num_workers": 1, "persistent_workers": True},
])
def test_state_dict_resumes_at_the_next_unseen_batch(kwargs, monkeypatch):
    """Mid-epoch state resumes at the next unseen batch with the same order and leaves the global RNG where the
    uninterrupted run left it: by default the epoch's shuffle and worker seeds are drawn again from the saved
    global state (the persistent case: its fresh iterator draws a worker seed the saved pass did not); with
    data_own_rng from the loader's own generators."""
    kwargs = dict(kwargs)
    monkeypatch.setenv("HASTEN_DATA_OWN_RNG", "1" if kwargs.pop("own_rng", False) else "0")
    loader_kwargs = {k: v for k, v in kwargs.items() if k in ("num_workers", "persistent_workers")}
    prepare_kwargs = {k: v for k, v in kwargs.items() if k not in loader_kwargs}

    def make():
        return prepare_data_loader(DataLoader(list(range(17)), batch_size=3, shuffle=True, **loader_kwargs),
                                   rng_types=["generator"], **prepare_kwargs)

    torch.manual_seed(0)
    loader = make()
    full = []
    for epoch in range(3):
        for index, batch in enumerate(loader):
            full.append(batch.tolist())
            if epoch == 1 and index == 3:
                saved = json.loads(json.dumps(loader.state_dict()))
                global_rng, cut = torch.get_rng_state(), len(full)
    probe = torch.rand(2)
    assert saved["epoch"] == 1 and saved["batches_yielded"] == 4

    torch.manual_seed(42)
    resumed = make()
    resumed.load_state_dict(saved)
    assert resumed.state_dict() == saved  # loaded state reads back unchanged before iterating
    torch.set_rng_state(global_rng)
    rest = [batch.tolist() for _ in range(1, 3) for batch in resumed]
    assert rest == full[cut:]
    assert torch.equal(torch.rand(2), probe)


@pytest.mark.parametrize("own_rng", ["0", "1"])
def test_state_between_epochs_and_mismatched_loaders(own_rng, monkeypatch):
    monkeypatch.setenv("HASTEN_DATA_OWN_RNG", own_rng)
    loader = prepare_data_loader(DataLoader(list(range(6)), batch_size=2, shuffle=True))
    rows(loader)
    state = loader.state_dict()
    global_rng = torch.get_rng_state()
    assert state["epoch"] == 1 and state["batches_yielded"] == 0 and "global_rng" not in state
    following = rows(loader)
    other = prepare_data_loader(DataLoader(list(range(6)), batch_size=2, shuffle=True))
    other.load_state_dict(state)
    if own_rng == "0":
        # An epoch not begun yet draws its order from the global RNG (as torch's RandomSampler): restoring the
        # loader's state then goes with restoring that RNG, which load_state does from random_states_<i>.pkl.
        torch.set_rng_state(global_rng)
    assert rows(other) == following
    sharded = prepare_data_loader(DataLoader(list(range(6)), batch_size=2, shuffle=True), num_processes=2,
                                  process_index=0)  # a shuffle generator in both modes
    sequential = prepare_data_loader(DataLoader(list(range(6)), batch_size=2), num_processes=2, process_index=0)
    with pytest.raises(ValueError, match="built differently"):
        sequential.load_state_dict(sharded.state_dict())


# -- real processes ----------------------------------------------------------------------------------------------

def test_two_processes_sharding_metrics_epochs_and_skipping():
    output = launch("data_sharding.py").stdout
    for check in ("reference layouts", "map-style exactly once", "iterable shard", "dispatcher exactly once",
                  "dispatcher error reaches every rank", "dispatched plain values", "end_of_dataloader",
                  "set_epoch shuffles alike on every rank",
                  "shared shuffle without rng_types", "skip_first_batches",
                  "default draws from the global RNG as torch does", "data_own_rng leaves the global RNG alone"):
        assert f"OK {check}" in output, output


def test_two_processes_resume_exactly():
    output = launch("data_resume.py").stdout
    for check in ("shuffled shard", "seedable split", "shuffle without rng_types", "iterable shard",
                  "dispatched stream", "dispatched shuffled map-style", "end of epoch"):
        assert f"OK resume {check}" in output, output
    assert "OK skipped samples are not read" in output


def test_join_uneven_inputs_lets_cpu_processes_finish_uneven_batches():
    """Issue 40: on 2 CPU processes the rank with an extra batch waited forever in DDP's all-reduce (Accelerate's
    test_distributed_data_loop hung at "Test joining uneven inputs"); torch's Join now runs on MULTI_CPU too. The
    timeout turns a regression into a failure instead of a hung suite."""
    output = launch("join_uneven.py", timeout=120).stdout
    for rank in (0, 1):
        assert f"OK joined uneven inputs on rank {rank}" in output and f"OK warned without DDP on rank {rank}" in output


def test_join_uneven_inputs_override_reaches_prepared_loaders_and_is_restored():
    """`join_uneven_inputs(even_batches=False)` switches the prepared map-style loaders' samplers for the block
    and restores them after; an iterable loader is named in a warning instead of being silently skipped: a
    UserWarning with Accelerate's words first (its test_distributed_data_loop checks them)."""
    from hasten.data.metrics import override_even_batches
    from hasten.data_loader import prepare_data_loader

    mapped = prepare_data_loader(torch.utils.data.DataLoader(list(range(10)), batch_size=2), num_processes=2,
                                 process_index=0)

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(10))

    streamed = prepare_data_loader(torch.utils.data.DataLoader(Stream(), batch_size=2), num_processes=2,
                                   process_index=0)
    holder = mapped.sampler if isinstance(mapped.sampler, torch.utils.data.BatchSampler) else mapped.batch_sampler
    assert holder.even_batches is True
    with pytest.warns(UserWarning, match=r"^Overriding even_batches is only supported for map-style datasets, yet "
                                         r"some dataloaders given were iterable: even_batches cannot be changed"):
        with override_even_batches([mapped, streamed], False):
            assert holder.even_batches is False
    assert holder.even_batches is True


def test_gather_for_metrics_does_not_swallow_an_error(monkeypatch):
    """A failure while dropping the last batch's duplicates is raised, not answered with the padded data."""
    from hasten import Accelerator

    accelerator = Accelerator()
    state = GradientState()
    monkeypatch.setattr(type(state), "end_of_dataloader", property(lambda self: True))
    monkeypatch.setattr(type(state), "remainder", property(lambda self: 1 / 0))
    with pytest.raises(ZeroDivisionError):
        accelerator.gather_for_metrics(torch.ones(3))
