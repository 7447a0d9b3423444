"""Shared pieces of the DeepSpeed test scripts: a small model, a fixed dataset, and the plain-PyTorch reference
(one process, whole global batch, AdamW, clipping at 1.0 — what DDP computes on the same data)."""

from __future__ import annotations

import torch

from hasten.state import AcceleratorState, GradientState

DIM, ROWS, PER_PROCESS = 8, 64, 4
LR = 1e-2


class Config:
    hidden_size = 16


class Net(torch.nn.Module):
    def __init__(self, dropout: float = 0.0):
        super().__init__()
        self.config = Config()  # transformers-style: "auto" bucket sizes come from config.hidden_size
        self.body = torch.nn.Sequential(
            torch.nn.Linear(DIM, 16), torch.nn.ReLU(), torch.nn.Dropout(dropout), torch.nn.Linear(16, 16),
            torch.nn.ReLU(), torch.nn.Linear(16, 1),
        )

    def forward(self, x):
        return self.body(x)


def make_model(seed: int = 0, dropout: float = 0.0) -> Net:
    torch.manual_seed(seed)
    return Net(dropout)


def dataset() -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(123)
    x = torch.randn(ROWS, DIM, generator=g)
    return torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True).sin())


def loader(batch_size: int = PER_PROCESS) -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(dataset(), batch_size=batch_size, shuffle=False)


def loss_of(model, x, y):
    dtype = next(p.dtype for p in model.parameters())
    return torch.nn.functional.mse_loss(model(x.to(dtype)).float(), y)


def reference(steps: int, num_processes: int, seed: int = 0) -> dict:
    """The weights after `steps` optimizer steps on the global batches (what DDP computes)."""
    model = make_model(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    x, y = dataset().tensors
    per_step = PER_PROCESS * num_processes
    for step in range(steps):
        rows = slice(step * per_step, (step + 1) * per_step)
        optimizer.zero_grad()
        loss_of(model, x[rows], y[rows]).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def max_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys(), (sorted(a), sorted(b))
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def reset_state() -> None:
    """A new Accelerator in the same processes (the process group and DeepSpeed's comm stay up)."""
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
