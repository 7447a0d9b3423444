"""`gpu_roundtrip.py BACKEND DIR`: prepare -> 20 steps -> save_state -> 5 more steps; then a fresh Accelerator
and model load_state and must repeat those 5 steps' losses exactly. BACKEND: ddp, fsdp1, fsdp2, tp, zero2, zero3.
Run by tests/gpu/test_backends_gpu.py on CUDA (NCCL)."""

import os
import sys
import time

import torch

from hasten import Accelerator
from hasten.state import AcceleratorState, GradientState

backend, root = sys.argv[1], sys.argv[2]
DIM, STEPS = 64, 20


def make():
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    kwargs = {}
    if backend.startswith("fsdp"):
        from hasten.backends.fsdp.plugin import FullyShardedDataParallelPlugin

        kwargs["fsdp_plugin"] = FullyShardedDataParallelPlugin(fsdp_version=int(backend[-1]))
    elif backend.startswith("zero"):
        from hasten.backends.deepspeed.plugin import DeepSpeedPlugin

        kwargs["deepspeed_plugin"] = DeepSpeedPlugin(zero_stage=int(backend[-1]), gradient_clipping=1.0)
    elif backend == "tp":
        from hasten.parallelism_config import ParallelismConfig

        kwargs["parallelism_config"] = ParallelismConfig(tp_size=torch.cuda.device_count())
    acc = Accelerator(**kwargs)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(DIM, 4 * DIM), torch.nn.GELU(), torch.nn.Linear(4 * DIM, DIM))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if backend.startswith("zero"):
        data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, DIM)), batch_size=4)
        model, optimizer, _ = acc.prepare(model, optimizer, data)
    else:
        model, optimizer = acc.prepare(model, optimizer)
    return acc, model, optimizer


def steps(acc, model, optimizer, indices):
    losses = []
    for step in indices:
        g = torch.Generator().manual_seed(step * 10 + acc.process_index)
        x = torch.randn(4, DIM, generator=g).to(acc.device)
        loss = (model(x) - x).pow(2).mean()
        acc.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(acc.reduce(loss.detach(), reduction="mean").item())
    return losses


start = time.perf_counter()
acc, model, optimizer = make()
first = steps(acc, model, optimizer, range(STEPS))
assert first[-1] < first[0], first
folder = os.path.join(root, backend)
acc.save_state(folder)
expected = steps(acc, model, optimizer, range(STEPS, STEPS + 5))
acc, model, optimizer = make()
acc.load_state(folder)
resumed = steps(acc, model, optimizer, range(STEPS, STEPS + 5))
assert resumed == expected, (resumed, expected)
print(f"rank {acc.process_index}: {backend} round trip identical in {time.perf_counter() - start:.1f} s", flush=True)
