"""A tiny regression problem for tests: y = a*x + b plus noise, and a two-parameter model that fits it."""

from __future__ import annotations

import numpy as np
import torch


class RegressionDataset:
    """`length` samples `{"x": float32, "y": float32}` with y = a*x + b + N(0, 0.1); `seed` fixes them."""

    def __init__(self, a=2, b=3, length: int = 64, seed=None):
        rng = np.random.default_rng(seed)
        self.length = length
        self.x = rng.normal(size=(length,)).astype(np.float32)
        self.y = a * self.x + b + rng.normal(scale=0.1, size=(length,)).astype(np.float32)

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        return {"x": self.x[i], "y": self.y[i]}


class RegressionModel(torch.nn.Module):
    """`x * a + b` with scalar parameters `a` and `b`; prints the dtypes it sees on its first batch (tests read
    them to check mixed precision). With `double_output=True` it returns the prediction twice, as a tuple
    (Accelerate 1.15 accepts the flag and ignores it)."""

    def __init__(self, a=0, b=0, double_output: bool = False):
        super().__init__()
        self.a = torch.nn.Parameter(torch.tensor(a).float())
        self.b = torch.nn.Parameter(torch.tensor(b).float())
        self.double_output = double_output
        self.first_batch = True

    def forward(self, x=None):
        if self.first_batch:
            print(f"Model dtype: {self.a.dtype}, {self.b.dtype}. Input dtype: {x.dtype}")
            self.first_batch = False
        y = x * self.a + self.b
        return (y, y) if self.double_output else y
