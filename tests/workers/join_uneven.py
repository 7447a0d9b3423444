"""Launched by tests/test_data_loader.py on 2 CPU processes: `join_uneven_inputs` lets the process with fewer
batches finish early under DDP on gloo (Accelerate's pattern in its test_distributed_data_loop script, which does
nothing on MULTI_CPU and hangs there), and `multi_device` answers as Accelerate's. Prints `OK <check>` lines."""

from __future__ import annotations

import warnings

import torch
from torch.utils.data import DataLoader

from hasten import Accelerator, DataLoaderConfiguration, DistributedType

accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(even_batches=False))
assert accelerator.distributed_type == DistributedType.MULTI_CPU and accelerator.num_processes == 2
assert accelerator.multi_device is False  # Accelerate's answer on CPU processes
model = accelerator.prepare(torch.nn.Linear(1, 1))
loader = accelerator.prepare(DataLoader(torch.arange(3, dtype=torch.float32).unsqueeze(1), batch_size=1))
steps = []
with accelerator.join_uneven_inputs([model]):
    for index, batch in enumerate(loader):
        model(batch).sum().backward()  # DDP's all-reduce: the process with one batch must not leave its peer waiting
        steps.append(index)
accelerator.wait_for_everyone()
assert steps == ([0, 1] if accelerator.process_index == 0 else [0]), steps
print(f"OK joined uneven inputs on rank {accelerator.process_index}", flush=True)

# Not plain DDP (FSDP here, as Accelerate's script fakes it): nothing joins, with Accelerate's warning words.
accelerator.state.distributed_type = DistributedType.FSDP
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with accelerator.join_uneven_inputs([object()]):
        pass
assert any("only supported for multi-GPU" in str(w.message) for w in caught), [str(w.message) for w in caught]
accelerator.state.distributed_type = DistributedType.MULTI_CPU
print(f"OK warned without DDP on rank {accelerator.process_index}", flush=True)
