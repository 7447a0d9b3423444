"""Small models for the big-model tests: shapes that exercise splitting, no-split blocks, tied weights,
buffers and direct parameters. Deterministic sizes (fp32 unless said)."""

from __future__ import annotations

import torch
from torch import nn


class Mlp(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.up = nn.Linear(dim, 2 * dim)
        self.down = nn.Linear(2 * dim, dim)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


class Block(nn.Module):
    """A residual block: splitting it between devices is allowed but slow, so tests mark it no-split."""

    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.attn = nn.Linear(dim, dim)
        self.mlp = Mlp(dim)

    def forward(self, x):
        x = x + self.attn(self.norm(x))
        return x + self.mlp(x)


class TinyLM(nn.Module):
    """Embedding tied to the output layer, a stack of blocks, a final norm."""

    def __init__(self, vocab=64, dim=16, depth=4, tie=True):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        if tie:
            self.head.weight = self.embed.weight

    def forward(self, ids):
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


class WithBuffers(nn.Module):
    """Linear, BatchNorm (buffers incl. an int64 counter), Linear; plus a root parameter and buffer."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(4))
        self.linear1 = nn.Linear(3, 4)
        self.batchnorm = nn.BatchNorm1d(4)
        self.linear2 = nn.Linear(4, 5)
        self.register_buffer("offset", torch.full((5,), 0.5))

    def forward(self, x):
        return self.linear2(self.batchnorm(self.linear1(x) * self.scale)) + self.offset


class Nested(nn.Module):
    """Two levels of Sequential with uneven layers."""

    def __init__(self):
        super().__init__()
        self.first = nn.Linear(8, 64)
        self.middle = nn.Sequential(nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 32)),
                                    nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 32)))
        self.last = nn.Linear(32, 4)

    def forward(self, x):
        return self.last(self.middle(self.first(x)))


def three_linears():
    return nn.Sequential(nn.Linear(100, 100), nn.Linear(100, 100), nn.Linear(100, 100))


MODELS = {
    "tiny_lm": lambda: TinyLM(),
    "tiny_lm_untied": lambda: TinyLM(tie=False),
    "with_buffers": WithBuffers,
    "nested": Nested,
    "three_linears": three_linears,
}
