"""Shared pieces of the tensor parallel test scripts: a plain PyTorch transformer (no tp_plan attribute, nothing
hasten-specific), deterministic token batches, and a one-process reference run."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hasten import Accelerator
from hasten.state import AcceleratorState, GradientState

VOCAB, DIM, HEADS, SEQ, GLOBAL_BATCH = 32, 16, 4, 8, 4


class Attention(torch.nn.Module):
    def __init__(self, dim=DIM, n_heads=HEADS):
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = dim // n_heads
        self.q_proj = torch.nn.Linear(dim, dim)
        self.k_proj = torch.nn.Linear(dim, dim)
        self.v_proj = torch.nn.Linear(dim, dim)
        self.o_proj = torch.nn.Linear(dim, dim)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = (p(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim))


class MLP(torch.nn.Module):
    def __init__(self, dim=DIM):
        super().__init__()
        self.fc1 = torch.nn.Linear(dim, 4 * dim)
        self.fc2 = torch.nn.Linear(4 * dim, dim)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class Block(torch.nn.Module):
    def __init__(self, dim=DIM):
        super().__init__()
        self.norm1 = torch.nn.LayerNorm(dim)
        self.attn = Attention(dim)
        self.norm2 = torch.nn.LayerNorm(dim)
        self.mlp = MLP(dim)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TinyGPT(torch.nn.Module):
    _no_split_modules = ["Block"]

    def __init__(self, depth=2):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(depth))
        self.norm = torch.nn.LayerNorm(DIM)
        self.head = torch.nn.Linear(DIM, VOCAB)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def make_model(seed=0):
    torch.manual_seed(seed)
    return TinyGPT()


def tokens(step: int, size: int = GLOBAL_BATCH):
    g = torch.Generator().manual_seed(500 + step)
    return torch.randint(0, VOCAB, (size, SEQ + 1), generator=g)


def loss_of(model, batch):
    logits = model(batch[:, :-1])
    return F.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))


def sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def reference(steps, start=None):
    """Whole parameters and losses of one process training the global batches of `steps`."""
    model = make_model()
    if start is not None:
        model.load_state_dict(start)
    opt = sgd(model.parameters())
    losses = []
    for step in steps:
        loss = loss_of(model, tokens(step))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, losses


def fresh_accelerator(**kwargs) -> Accelerator:
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    return Accelerator(**kwargs)


def whole(state: dict) -> dict:
    """DTensors made whole (every rank gets the full tensors)."""
    from torch.distributed.tensor import DTensor

    return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().float() for k, v in state.items()}


def max_diff(a: dict, b: dict) -> float:
    assert set(a) == set(b), (sorted(a), sorted(b))
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)
