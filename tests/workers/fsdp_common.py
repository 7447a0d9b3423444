"""Shared pieces of the FSDP test scripts: a small block model, deterministic data, a training step."""

from __future__ import annotations

import torch

from hasten import Accelerator
from hasten.state import AcceleratorState, GradientState

DIM = 16
GLOBAL_BATCH = 8


class Block(torch.nn.Module):
    def __init__(self, dim=DIM):
        super().__init__()
        self.linear = torch.nn.Linear(dim, dim)
        self.norm = torch.nn.LayerNorm(dim)

    def forward(self, x):
        return x + torch.relu(self.norm(self.linear(x)))


class Net(torch.nn.Module):
    _no_split_modules = ["Block"]

    def __init__(self, dim=DIM, depth=3):
        super().__init__()
        self.inp = torch.nn.Linear(dim, dim)
        self.blocks = torch.nn.ModuleList(Block(dim) for _ in range(depth))
        self.out = torch.nn.Linear(dim, 1)

    def forward(self, x):
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.out(x)


def make_model(seed=0, **kwargs):
    torch.manual_seed(seed)
    return Net(**kwargs)


def batch(step: int, rank: int, world: int, size: int = GLOBAL_BATCH):
    """This process's rows of the global batch of `step` (the same global batch for any world size)."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(size, DIM, generator=g)
    y = x.sum(dim=1, keepdim=True).sin()
    per = size // world
    return x[rank * per:(rank + 1) * per], y[rank * per:(rank + 1) * per]


def fresh_accelerator(**kwargs) -> Accelerator:
    """A new Accelerator in the same processes (the process group stays up)."""
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    return Accelerator(**kwargs)


def train_steps(accelerator, model, optimizer, steps, max_norm=None):
    """Run `steps` (a range of step indices); return the global mean loss of each."""
    losses = []
    for step in steps:
        x, y = batch(step, accelerator.process_index, accelerator.num_processes)
        # .float(): FSDP2's bf16 output_dtype meets an fp32 target, whose mixed-dtype backward torch 2.11 fails
        loss = torch.nn.functional.mse_loss(model(x).float(), y)
        accelerator.backward(loss)
        if max_norm is not None:
            accelerator.clip_grad_norm_(model.parameters(), max_norm)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(accelerator.reduce(loss.detach(), reduction="mean").item())
    return losses


def full_params(accelerator, model) -> dict:
    """Whole parameters on every process (the model's own names)."""
    state = accelerator.get_state_dict(model)
    obj = [state if accelerator.is_main_process else None]
    torch.distributed.broadcast_object_list(obj, src=0)
    return {k: v.float() for k, v in obj[0].items()}


def max_diff(a: dict, b: dict) -> float:
    assert set(a) == set(b), (sorted(a), sorted(b))
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)
