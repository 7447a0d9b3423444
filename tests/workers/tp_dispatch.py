"""4 processes, dp_shard 2 × tp 2, dispatch_batches=True: process 0 reads, the two ranks of one tensor-parallel group
keep the same slice of every step, the two data-parallel groups keep disjoint slices that together cover the
dataset, and gather_for_metrics returns each sample exactly once. Context parallelism with dispatch is refused.
Prints `OK <name>` on rank 0 for each check."""

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.utils.data import DataLoader, IterableDataset

from hasten import Accelerator, DataLoaderConfiguration, ParallelismConfig
from hasten.core.errors import ConfigError
from hasten.data.ranks import data_ranks, mesh_data_sharding
from hasten.state import AcceleratorState, GradientState


class Stream(IterableDataset):
    def __iter__(self):
        return iter(torch.arange(13).split(1))


acc = Accelerator(parallelism_config=ParallelismConfig(dp_shard_size=2, tp_size=2),
                  dataloader_config=DataLoaderConfiguration(dispatch_batches=True))
mesh = acc.torch_device_mesh
assert mesh.mesh_dim_names == ("dp_shard", "tp"), mesh.mesh_dim_names
_, dp_index = data_ranks(mesh)


def ok(name):
    acc.wait_for_everyone()
    if acc.process_index == 0:
        print(f"OK {name}", flush=True)


def check(name, loader, total):
    loader = acc.prepare(loader)
    assert type(loader).__name__ == "DataLoaderDispatcher", type(loader)
    seen = [batch.flatten().tolist() for batch in loader]
    everyone = [None] * 4
    dist.all_gather_object(everyone, (dp_index, seen))
    for other_index, other_seen in everyone:  # one tensor-parallel group: the same slices, step by step
        if other_index == dp_index:
            assert other_seen == seen, (name, everyone)
    groups = {index: batches for index, batches in everyone}
    assert len(groups) == 2 and len(groups[0]) == len(groups[1]), (name, groups)
    real = [x for step in zip(groups[0], groups[1]) for part in step for x in part]
    assert sorted(real[:total]) == list(range(total)), (name, groups)  # disjoint, covering (then padding)
    gathered = torch.cat([acc.gather_for_metrics(batch).flatten() for batch in loader])
    assert sorted(gathered.tolist()) == list(range(total)), (name, gathered)  # each sample exactly once
    resumed = [batch.flatten().tolist() for batch in acc.skip_first_batches(loader, 1)]
    # a resumed pass keeps the data-parallel slicing (its padding, if any, comes from its own first step)
    assert resumed[:-1] == seen[1:-1], (name, resumed, seen)
    dist.all_gather_object(everyone, (dp_index, resumed))
    assert all(other == resumed for index, other in everyone if index == dp_index), (name, everyone)
    ok(name)


check("map-style dispatched by tp group", DataLoader(torch.arange(11), batch_size=2), 11)
check("an even dataset dispatched by tp group", DataLoader(torch.arange(12), batch_size=4), 12)
check("stream dispatched by tp group", DataLoader(Stream(), batch_size=3), 13)

AcceleratorState._reset_state(reset_partial_state=True)
GradientState._reset_state()
acc = Accelerator(parallelism_config=ParallelismConfig(dp_shard_size=2, tp_size=2),
                  dataloader_config=DataLoaderConfiguration(dispatch_batches=True, split_batches=True))
check("split batches dispatched by tp group", DataLoader(torch.arange(12), batch_size=4), 12)

cp_mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_shard", "cp"))
try:
    mesh_data_sharding(cp_mesh, True)
except ConfigError as error:
    assert "cp" in str(error) and "\n" not in str(error), error
else:
    raise AssertionError("dispatch_batches=True under context parallelism was accepted")
ok("dispatch refused under context parallelism")
