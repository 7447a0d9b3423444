"""Run on 2 processes: which samples each rank reads, gather_for_metrics, set_epoch, skip_first_batches.

Every check asserts on every rank and prints `OK <name>` on rank 0, so the test can see what ran.
"""

import torch
from torch.utils.data import DataLoader, IterableDataset

from hasten.data_loader import gather_for_metrics, prepare_data_loader, skip_first_batches
from hasten.distributed.operations import gather_object
from hasten.state import GradientState, PartialState

state = PartialState()
assert state.num_processes == 2, state
RANK = state.process_index


def ok(name):
    state.wait_for_everyone()
    if RANK == 0:
        print(f"OK {name}", flush=True)


class Stream(IterableDataset):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(range(self.n))


def rows(loader):
    """This rank's batches as lists of ints."""
    return [batch.tolist() for batch in loader]


def everyone(value):
    """Per-rank values, indexed by rank."""
    return gather_object([value])


def metrics_pass(loader, use_gather_object=False):
    """Gather every batch for metrics; return the concatenation (same on every rank)."""
    seen = []
    for batch in loader:
        data = batch.tolist() if use_gather_object else batch
        gathered = gather_for_metrics(data, use_gather_object=use_gather_object)
        seen += gathered if use_gather_object else gathered.tolist()
    return seen


# -- the reference's verified layouts --------------------------------------------------------------------
loader = prepare_data_loader(DataLoader(list(range(9)), batch_size=2))
assert isinstance(loader, DataLoader)
assert everyone(rows(loader)) == [[[0, 1], [4, 5], [8, 0]], [[2, 3], [6, 7], [1, 2]]]
loader = prepare_data_loader(DataLoader(list(range(9)), batch_size=2), even_batches=False)
assert everyone(rows(loader)) == [[[0, 1], [4, 5], [8]], [[2, 3], [6, 7]]]
loader = prepare_data_loader(DataLoader(list(range(9)), batch_size=2), split_batches=True)
assert everyone(rows(loader)) == [[[0], [2], [4], [6], [8]], [[1], [3], [5], [7], [0]]]
ok("reference layouts")

# -- every sample exactly once per epoch (gathered for metrics), map-style ---------------------------------
for size in (8, 9, 11):
    for batch_size in (2, 3, 4):
        for split in (False, True):
            if split and batch_size % 2:
                continue
            loader = prepare_data_loader(DataLoader(list(range(size)), batch_size=batch_size), split_batches=split)
            counts = everyone(len(loader))
            assert counts[0] == counts[1], (size, batch_size, split, counts)
            assert metrics_pass(loader) == list(range(size)), (size, batch_size, split)
            for_objects = prepare_data_loader(DataLoader(list(range(size)), batch_size=batch_size),
                                              split_batches=split)
            assert metrics_pass(for_objects, use_gather_object=True) == list(range(size))
        # even_batches=False: no padding at all, every sample read by exactly one rank
        loader = prepare_data_loader(DataLoader(list(range(size)), batch_size=batch_size), even_batches=False)
        mine = [i for batch in rows(loader) for i in batch]
        together = sorted(i for per_rank in everyone(mine) for i in per_rank)
        assert together == list(range(size)), (size, batch_size, together)
ok("map-style exactly once")

# -- iterable datasets --------------------------------------------------------------------------------------
# Sharded stream (no dispatch): each rank reads its slice; the padded tail repeats the first items, and
# gather_for_metrics drops exactly those (the shard counts the real items of the last group; issue 24).
loader = prepare_data_loader(DataLoader(Stream(9), batch_size=2), put_on_device=False)
assert everyone(rows(loader)) == [[[0, 1], [4, 5], [8, 0]], [[2, 3], [6, 7], [1, 2]]]
assert metrics_pass(loader) == list(range(9))
for size in (8, 9, 13):
    loader = prepare_data_loader(DataLoader(Stream(size), batch_size=3), put_on_device=False)
    mine = [i for batch in rows(loader) for i in batch]
    together = [i for per_rank in everyone(mine) for i in per_rank]
    assert sorted(set(together)) == list(range(size)), (size, together)
    assert everyone(len(mine))[0] == everyone(len(mine))[1]
ok("iterable shard")

# Dispatched stream (the default once put_on_device): rank 0 reads, everyone gets a slice, duplicates dropped.
loader = prepare_data_loader(DataLoader(Stream(9), batch_size=2), put_on_device=True, device=state.device)
assert type(loader).__name__ == "DataLoaderDispatcher"
assert everyone(rows(loader)) == [[[0, 1], [4, 5], [8]], [[2, 3], [6, 7], [0]]]
for size in (8, 9, 11, 1):
    for batch_size in (2, 3, 4):
        for split in (False, True):
            if split and batch_size % 2:
                continue
            loader = prepare_data_loader(DataLoader(Stream(size), batch_size=batch_size), put_on_device=True,
                                         split_batches=split)
            assert metrics_pass(loader) == list(range(size)), (size, batch_size, split)
# Map-style dataset dispatched on request.
loader = prepare_data_loader(DataLoader(list(range(11)), batch_size=3), put_on_device=True, dispatch_batches=True)
assert type(loader).__name__ == "DataLoaderDispatcher"
assert metrics_pass(loader) == list(range(11))
assert metrics_pass(loader, use_gather_object=True) == list(range(11))
ok("dispatcher exactly once")

# A dispatch error on rank 0 reaches every rank instead of hanging them.
words = DataLoader(["a", "b", "c", "d"], batch_size=2)
loader = prepare_data_loader(words, put_on_device=True, dispatch_batches=True)
try:
    rows(loader)
except ValueError as error:
    assert "dispatch_batches=False" in str(error)
else:
    raise AssertionError("non-tensor batches were dispatched")
ok("dispatcher error reaches every rank")

# Plain values beside the tensors reach every rank whole, while the tensors are sliced; values that cannot be
# pickled, or that would have to be joined across the batches of a step, are refused on every rank.
def tagged(samples):
    return {"x": torch.tensor(samples), "source": "wiki"}


loader = prepare_data_loader(DataLoader(Stream(7), batch_size=4, collate_fn=tagged), put_on_device=True,
                             split_batches=True)
got = [(batch["x"].tolist(), batch["source"]) for batch in loader]
assert got == ([([0, 1], "wiki"), ([4, 5], "wiki")] if RANK == 0 else [([2, 3], "wiki"), ([6, 0], "wiki")]), got
for collate, split, wording in ((lambda s: {"x": torch.tensor(s), "fn": lambda: 0}, True, "cannot be pickled"),
                                (tagged, False, "joins 2 batches")):
    try:
        rows(prepare_data_loader(DataLoader(Stream(6), batch_size=2, collate_fn=collate), put_on_device=True,
                                 split_batches=split))
    except ValueError as error:
        assert wording in str(error), error
    else:
        raise AssertionError(wording)
ok("dispatched plain values")

# -- end_of_dataloader / GradientState -----------------------------------------------------------------------
loader = prepare_data_loader(DataLoader(list(range(9)), batch_size=2))
flags = []
for batch in loader:
    assert GradientState().active_dataloader is loader
    flags.append((GradientState().end_of_dataloader, GradientState().remainder))
assert flags == [(False, 1), (False, 1), (True, 1)], flags
assert not GradientState().in_dataloader
ok("end_of_dataloader")

# -- set_epoch and shuffling -----------------------------------------------------------------------------------
torch.manual_seed(RANK)  # different global RNG per rank: the loader must still agree across ranks
loader = prepare_data_loader(DataLoader(list(range(16)), batch_size=2, shuffle=True), rng_types=["generator"])
epochs = []
for epoch in range(3):
    loader.set_epoch(epoch)
    mine = [i for batch in rows(loader) for i in batch]
    together = [i for per_rank in everyone(mine) for i in per_rank]
    assert sorted(together) == list(range(16)), together  # one shared permutation, split without overlap
    epochs.append(together)
assert len({tuple(e) for e in epochs}) == 3  # a new shuffle every epoch

torch.manual_seed(100 + RANK)
loader = prepare_data_loader(DataLoader(list(range(16)), batch_size=2, shuffle=True), use_seedable_sampler=True,
                             data_seed=7)
orders = {}
for epoch in (0, 1, 0):
    loader.set_epoch(epoch)
    mine = [i for batch in rows(loader) for i in batch]
    together = [i for per_rank in everyone(mine) for i in per_rank]
    assert sorted(together) == list(range(16))
    assert orders.setdefault(epoch, together) == together  # set_epoch(e) replays epoch e
assert orders[0] != orders[1]
ok("set_epoch shuffles alike on every rank")

# Without rng_types the shuffle is still shared: the loader's generator seed comes from rank 0.
torch.manual_seed(200 + RANK)
loader = prepare_data_loader(DataLoader(list(range(16)), batch_size=2, shuffle=True))
for _ in range(2):
    mine = [i for batch in rows(loader) for i in batch]
    assert sorted(i for per_rank in everyone(mine) for i in per_rank) == list(range(16))
ok("shared shuffle without rng_types")

# -- skip_first_batches --------------------------------------------------------------------------------------
loader = prepare_data_loader(DataLoader(list(range(12)), batch_size=2))
skipped = skip_first_batches(loader, 1)
assert type(skipped) is type(loader) and isinstance(skipped, DataLoader)
assert everyone(rows(skipped)) == [[[4, 5], [8, 9]], [[6, 7], [10, 11]]]
assert len(skipped) == 2
loader = prepare_data_loader(DataLoader(Stream(12), batch_size=2), put_on_device=False)
assert everyone(rows(skip_first_batches(loader, 2))) == [[[8, 9]], [[10, 11]]]
loader = prepare_data_loader(DataLoader(Stream(12), batch_size=2), put_on_device=True)
assert everyone(rows(skip_first_batches(loader, 2))) == [[[8, 9]], [[10, 11]]]
loader = prepare_data_loader(DataLoader(list(range(12)), batch_size=2), put_on_device=True, dispatch_batches=True)
assert everyone(rows(skip_first_batches(loader, 2))) == [[[8, 9]], [[10, 11]]]
ok("skip_first_batches")

# -- the global torch RNG, default (as torch and Accelerate) and data_own_rng -----------------------------------
def draw(generator=None):
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())


EPOCHS = 3
# Shard: the shuffle generator is seeded from one global draw at prepare (process 0's everywhere) and kept in step
# by rng_types=["generator"]; every pass's iterator draws a worker seed from the global RNG.
torch.manual_seed(7)
loader = prepare_data_loader(DataLoader(list(range(12)), batch_size=2, shuffle=True), rng_types=["generator"])
mine = [rows(loader) for _ in range(EPOCHS)]
probe = torch.rand(3)
torch.manual_seed(7)
shuffle = torch.Generator().manual_seed(draw())
expected = []
for _ in range(EPOCHS):
    draw()  # the pass's worker seed
    order = torch.randperm(12, generator=shuffle).tolist()
    torch.randperm(12, generator=shuffle)  # RandomSampler's empty tail (num_samples % n items) still draws one
    expected.append([order[2 * b:2 * b + 2] for b in range(RANK, 6, 2)])
assert mine == expected and torch.equal(probe, torch.rand(3)), (RANK, mine, expected)

# Dispatcher: every process draws a worker seed per pass (each makes an iterator in Accelerate); process 0, the
# one that reads, then draws its sampler's shuffle seed, as torch's RandomSampler does without a generator.
torch.manual_seed(8)
loader = prepare_data_loader(DataLoader(list(range(8)), batch_size=2, shuffle=True), put_on_device=True,
                             dispatch_batches=True)
mine = [rows(loader) for _ in range(EPOCHS)]
probe = torch.rand(3)
torch.manual_seed(8)
for _ in range(EPOCHS):
    draw()
    if RANK == 0:
        draw()
assert torch.equal(probe, torch.rand(3)), RANK
assert all(sorted(i for per_rank in everyone(epoch) for batch in per_rank for i in batch) == list(range(8))
           for epoch in mine)
ok("default draws from the global RNG as torch does")

# data_own_rng: the loaders' own generators make every draw, the global RNG is left alone; ranks still agree.
import os  # noqa: E402

os.environ["HASTEN_DATA_OWN_RNG"] = "1"
torch.manual_seed(300 + RANK)
for kwargs in ({"rng_types": ["generator"]}, {"put_on_device": True, "dispatch_batches": True}):
    loader = prepare_data_loader(DataLoader(list(range(16)), batch_size=2, shuffle=True), **kwargs)
    before = torch.get_rng_state()
    epochs = [[i for batch in rows(loader) for i in batch] for _ in range(2)]
    assert torch.equal(before, torch.get_rng_state()), (RANK, kwargs)
    together = [[i for per_rank in everyone(epoch) for i in per_rank] for epoch in epochs]
    assert all(sorted(epoch) == list(range(16)) for epoch in together) and together[0] != together[1]
del os.environ["HASTEN_DATA_OWN_RNG"]
ok("data_own_rng leaves the global RNG alone")
