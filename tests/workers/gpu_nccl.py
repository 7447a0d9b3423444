"""`gpu_nccl.py DIR [--control-only]`: the default group is NCCL on a GPU (gloo on CPU), the control group is
gloo beside it, and every control collective of hasten (FSDP's flags, barriers, checkpoint decisions) works;
item 1 of issue 22 stopped every FSDP run here at prepare(). `--control-only` (two processes sharing one GPU)
stops before the first NCCL data collective. Run by tests/gpu/test_nccl.py."""

import os
import sys

import torch
import torch.distributed as dist
from gpu_common import ON_GPU, device_only

from hasten import Accelerator
from hasten.config.fsdp import FullyShardedDataParallelPlugin
from hasten.distributed import control
from hasten.state import AcceleratorState, GradientState

root = sys.argv[1]
control_only = "--control-only" in sys.argv
acc = Accelerator()
rank, world = acc.process_index, acc.num_processes
assert dist.is_initialized() and dist.get_world_size() == world, "under torchrun: a real group, even in one process"
device_only("the device is cuda:<local rank>", "no GPU",
            lambda: acc.device == torch.device("cuda", 0 if control_only else acc.local_process_index))
device_only("the default group is NCCL", "the CPU twin runs gloo", lambda: dist.get_backend() == "nccl")
group = control.control_group()
device_only("the control group is gloo beside NCCL", "gloo serves control collectives itself",
            lambda: group is not None and dist.get_backend(group) == "gloo")
assert control.any_rank(rank == world - 1) and not control.any_rank(False)
assert control.all_gather_objects(rank) == list(range(world))
assert control.broadcast_object(f"from {rank}") == "from 0"
acc.wait_for_everyone()  # the control barrier (issue 22, item 2)
if control_only:
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    acc = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    model, optimizer = acc.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
    assert all(p.device.type == acc.device.type for p in model.parameters())
    acc.wait_for_everyone()
    print(f"rank {rank}: control plane checks passed", flush=True)
    os._exit(0)  # no teardown collective either: NCCL never connects two ranks on one GPU
# data collectives stay on the default group, with device tensors
summed = acc.reduce(torch.ones(2, device=acc.device), reduction="sum")
assert summed.device.type == acc.device.type and summed.tolist() == [world, world]

for version in (1, 2):
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    acc = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=version))
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer = acc.prepare(model, optimizer)  # item 1: _on_any_rank ran here on NCCL
    loss = model(torch.randn(4, 8, device=acc.device)).pow(2).mean()
    acc.backward(loss)
    acc.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    acc.save_state(os.path.join(root, f"fsdp{version}"))
    acc.load_state(os.path.join(root, f"fsdp{version}"))
print(f"rank {rank}: nccl checks passed on {'GPU' if ON_GPU else 'CPU'}", flush=True)
