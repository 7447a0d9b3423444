"""A checkpoint saved by one number of processes, loaded by another: `world_change.py ROOT PHASE`. Run by
tests/checkpoint/test_world_change.py. PHASE `save`: DDP, a shuffled prepared loader part-way through its epoch,
save_state (per-rank random_states_<rank>.pkl, per-process loader positions). PHASE `load`: load_state() of it,
printing what happened on each rank (LOADED, or the error's type and its one line), then one epoch of training.
With KILL_IN_LOAD=<rank> that rank SIGKILLs itself inside load_state (from a load pre-hook)."""

import os
import sys

import torch

from hasten import Accelerator, ProjectConfiguration

root, phase = sys.argv[1], sys.argv[2]
acc = Accelerator(cpu=True, project_config=ProjectConfiguration(project_dir=root, automatic_checkpoint_naming=True))
torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.utils.data.TensorDataset(torch.randn(24, 4), torch.randn(24, 2))
loader = torch.utils.data.DataLoader(data, batch_size=2, shuffle=True)
model, optimizer, loader = acc.prepare(model, optimizer, loader)
if phase == "save":
    for i, (x, y) in enumerate(loader):
        acc.backward(torch.nn.functional.mse_loss(model(x), y))
        optimizer.step()
        optimizer.zero_grad()
        if i == 1:
            break
    acc.save_state()
    print(f"rank {acc.process_index} SAVED", flush=True)
else:
    if os.environ.get("KILL_IN_LOAD") == str(acc.process_index):  # dies in the middle of load_state
        acc.register_load_state_pre_hook(lambda models, folder: os.kill(os.getpid(), 9))
    try:
        acc.load_state()
        print(f"rank {acc.process_index} LOADED", flush=True)
        for x, y in loader:  # training goes on: DDP's gradient all-reduce needs every rank
            acc.backward(torch.nn.functional.mse_loss(model(x), y))
            optimizer.step()
            optimizer.zero_grad()
        print(f"rank {acc.process_index} TRAINED", flush=True)
    except Exception as error:  # noqa: BLE001
        print(f"rank {acc.process_index} {type(error).__name__}: {error}", flush=True)
        raise
