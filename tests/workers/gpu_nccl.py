"""On CUDA: the default group is NCCL, the control group is gloo beside it, and every control collective of
hasten (FSDP's flags, barriers, checkpoint decisions) works; item 1 stopped every FSDP run here at prepare().
Run by tests/gpu/test_nccl.py."""

import os
import sys

import torch
import torch.distributed as dist

from hasten import Accelerator
from hasten.backends.fsdp.plugin import FullyShardedDataParallelPlugin
from hasten.distributed import control

root = sys.argv[1]
acc = Accelerator()
rank, world = acc.process_index, acc.num_processes
assert acc.device == torch.device("cuda", acc.local_process_index), acc.device
assert torch.cuda.current_device() == acc.device.index
assert dist.get_backend() == "nccl", dist.get_backend()
group = control.control_group()
assert group is not None and dist.get_backend(group) == "gloo"
assert control.any_rank(rank == world - 1) and control.all_gather_objects(rank) == list(range(world))
acc.wait_for_everyone()  # the control barrier (item 2)
# data collectives stay on NCCL, with device tensors
summed = acc.reduce(torch.ones(2, device=acc.device), reduction="sum")
assert summed.device.type == "cuda" and summed.tolist() == [world, world]

from hasten.state import AcceleratorState, GradientState  # noqa: E402

for version in (1, 2):
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    acc = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=version))
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer = acc.prepare(model, optimizer)  # item 1: _on_any_rank ran here on NCCL
    loss = model(torch.randn(4, 8, device=acc.device)).pow(2).mean()
    acc.backward(loss)
    optimizer.step()
    acc.save_state(os.path.join(root, f"fsdp{version}"))
    acc.load_state(os.path.join(root, f"fsdp{version}"))
print(f"rank {rank}: nccl checks passed", flush=True)
