"""`gpu_roundtrip.py BACKEND DIR`: prepare -> 20 steps that must track a plain-PyTorch reference run ->
save_state -> 5 more steps; then a fresh Accelerator and model load_state and must repeat those 5 steps' losses
exactly. BACKEND: ddp, fsdp1, fsdp2, tp, zero2, zero3. Run by tests/gpu/test_backends_gpu.py, on CUDA (NCCL) on a
GPU machine and on CPU (gloo) in CI."""

import os
import sys
import time

import torch

from hasten import Accelerator
from hasten.state import AcceleratorState, GradientState

backend, root = sys.argv[1], sys.argv[2]
DIM, STEPS, MAX_NORM = 64, 20, 1.0


def build():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(DIM, 4 * DIM), torch.nn.GELU(), torch.nn.Linear(4 * DIM, DIM))


def make():
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    kwargs = {}
    if backend.startswith("fsdp"):
        from hasten.config.fsdp import FullyShardedDataParallelPlugin

        kwargs["fsdp_plugin"] = FullyShardedDataParallelPlugin(fsdp_version=int(backend[-1]))
    elif backend.startswith("zero"):
        from hasten.config.deepspeed import DeepSpeedPlugin

        kwargs["deepspeed_plugin"] = DeepSpeedPlugin(zero_stage=int(backend[-1]), gradient_clipping=MAX_NORM)
    elif backend == "tp":
        from hasten.parallelism_config import ParallelismConfig

        kwargs["parallelism_config"] = ParallelismConfig(tp_size=int(os.environ.get("WORLD_SIZE", "1")))
    acc = Accelerator(**kwargs)
    model = build()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if backend.startswith("zero"):
        data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, DIM)), batch_size=4)
        model, optimizer, _ = acc.prepare(model, optimizer, data)
    else:
        model, optimizer = acc.prepare(model, optimizer)
    return acc, model, optimizer


def inputs(step, rank):
    # Tensor-parallel ranks hold pieces of one model and must see the same batch (they got different ones,
    # and the old "loss decreased" check passed by noise); data-parallel ranks each see their own.
    g = torch.Generator().manual_seed(step * 10 + (0 if backend == "tp" else rank))
    return torch.randn(4, DIM, generator=g)


def steps(acc, model, optimizer, indices):
    losses = []
    for step in indices:
        x = inputs(step, acc.process_index).to(acc.device)
        loss = (model(x) - x).pow(2).mean()
        acc.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(acc.reduce(loss.detach(), reduction="mean").item())
    return losses


def reference(world, indices):
    """The same training in one plain process: the global batch (every data-parallel rank's rows), torch's AdamW."""
    model = build()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for step in indices:
        ranks = [0] if backend == "tp" else range(world)
        x = torch.cat([inputs(step, rank) for rank in ranks])
        loss = (model(x) - x).pow(2).mean()
        loss.backward()
        if backend.startswith("zero"):
            torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


start = time.perf_counter()
acc, model, optimizer = make()
first = steps(acc, model, optimizer, range(STEPS))
expected_first = reference(acc.num_processes, range(STEPS))
torch.testing.assert_close(torch.tensor(first), torch.tensor(expected_first), rtol=2e-3, atol=1e-5,
                           msg=lambda m: f"{backend} does not track the plain reference run: {m}\n{first}\n{expected_first}")
folder = os.path.join(root, backend)
acc.save_state(folder)
expected = steps(acc, model, optimizer, range(STEPS, STEPS + 5))
acc, model, optimizer = make()
acc.load_state(folder)
resumed = steps(acc, model, optimizer, range(STEPS, STEPS + 5))
assert resumed == expected, (resumed, expected)
print(f"rank {acc.process_index}: {backend} round trip identical in {time.perf_counter() - start:.1f} s", flush=True)
