"""Run on 2 processes: a loader's `state_dict()` taken mid-epoch resumes a fresh loader at the next unseen batch.

For each kind of loader, an uninterrupted run is recorded; then a fresh loader (built after a different global
seed, as a restarted job would) loads the JSON-round-tripped state and must yield exactly the rest, without
reading the skipped samples and leaving the global torch RNG where the uninterrupted run left it.
"""

import json

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from hasten.data_loader import prepare_data_loader
from hasten.distributed.operations import gather_object
from hasten.state import PartialState

state = PartialState()
assert state.num_processes == 2, state
RANK = state.process_index
EPOCHS = 3


class Recording(Dataset):
    """Map-style dataset that remembers which samples were read."""

    def __init__(self, n):
        self.n = n
        self.read = []

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        self.read.append(index)
        return index


class Stream(IterableDataset):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(range(self.n))


def ok(name):
    state.wait_for_everyone()
    if RANK == 0:
        print(f"OK {name}", flush=True)


def check_resume(name, make_loader, save_epoch=1, save_after=2):
    torch.manual_seed(1234)
    loader = make_loader()
    full, saved = [], None
    for _ in range(EPOCHS):
        for index, batch in enumerate(loader):
            full.append(batch.tolist())
            if loader.iteration == save_epoch and index == save_after - 1:
                saved = json.loads(json.dumps(loader.state_dict()))
                global_rng = torch.get_rng_state()
                cut = len(full)
    assert saved is not None, name
    probe_uninterrupted = torch.rand(3)

    torch.manual_seed(999 + RANK)  # a restarted job: different global RNG until the checkpoint restores it
    resumed = make_loader()
    resumed.load_state_dict(saved)
    assert resumed.state_dict()["batches_yielded"] == save_after
    torch.set_rng_state(global_rng)
    rest = []
    for _ in range(saved["epoch"], EPOCHS):
        rest.extend(batch.tolist() for batch in resumed)
    assert rest == full[cut:], (name, RANK, rest, full[cut:])
    assert torch.equal(torch.rand(3), probe_uninterrupted), f"{name}: the global torch RNG stream moved"
    assert resumed.iteration == EPOCHS
    # The two ranks together still read every sample of each epoch.
    everyone = gather_object([full])
    assert len(everyone) == 2
    ok(f"resume {name}")
    return resumed


# Shuffled map-style shard, generator synchronised each epoch; skipped samples are never read.
recording = Recording(23)
check_resume("shuffled shard", lambda: prepare_data_loader(
    DataLoader(recording, batch_size=3, shuffle=True), rng_types=["generator"]))
recording.read.clear()
torch.manual_seed(1234)
loader = prepare_data_loader(DataLoader(recording, batch_size=3, shuffle=True), rng_types=["generator"])
for index, _ in enumerate(loader):
    if index == 1:
        saved = loader.state_dict()
        break
recording.read.clear()
loader = prepare_data_loader(DataLoader(recording, batch_size=3, shuffle=True), rng_types=["generator"])
loader.load_state_dict(saved)
remaining = [i for batch in loader for i in batch.tolist()]
assert sorted(recording.read) == sorted(remaining) and len(remaining) == 3 * (len(loader) - 2), recording.read
ok("skipped samples are not read")

# Seedable sampler, split batches, shared shuffle without rng_types.
check_resume("seedable split", lambda: prepare_data_loader(
    DataLoader(list(range(22)), batch_size=4, shuffle=True), split_batches=True, use_seedable_sampler=True))
check_resume("shuffle without rng_types", lambda: prepare_data_loader(
    DataLoader(list(range(21)), batch_size=2, shuffle=True)), save_epoch=2, save_after=4)
# Iterable datasets: sharded and dispatched.
check_resume("iterable shard", lambda: prepare_data_loader(DataLoader(Stream(19), batch_size=2)))
check_resume("dispatched stream", lambda: prepare_data_loader(
    DataLoader(Stream(19), batch_size=2), put_on_device=True))
check_resume("dispatched shuffled map-style", lambda: prepare_data_loader(
    DataLoader(list(range(30)), batch_size=2, shuffle=True), put_on_device=True, dispatch_batches=True),
    save_after=3)

# Saved at the very end of an epoch (inside the loop, on the last batch): resumes with the next epoch.
check_resume("end of epoch", lambda: prepare_data_loader(
    DataLoader(list(range(12)), batch_size=3, shuffle=True), rng_types=["generator"]), save_after=2)
