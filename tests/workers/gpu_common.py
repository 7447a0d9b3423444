"""Shared by the GPU suite's workers (tests/workers/gpu_*.py): the device comes from the environment (CUDA
when present, else CPU with gloo), and an assertion that only means something on a GPU is skipped by name, with
the reason, on the CPU twin that CI runs."""

from __future__ import annotations

import torch

ON_GPU = torch.cuda.is_available()


def device_only(name: str, reason: str, check) -> None:
    """Assert `check()` on a GPU; on CPU print that assertion `name` was skipped and why (tests count these)."""
    if ON_GPU:
        assert check(), f"device-only check failed: {name}"
    else:
        print(f"device-only check skipped on CPU: {name} ({reason})", flush=True)
