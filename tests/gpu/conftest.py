"""The GPU suite: everything CUDA-specific, run by `bash scripts/gpu_check.sh` on a machine with a GPU.

Without CUDA (CI) every test here is skipped at collection, with one reason. Tests that need two GPUs skip on
one. Figures (ratios, times) are appended as JSON lines to $HASTEN_GPU_FIGURES for the script's table.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

CUDA = torch.cuda.is_available()
GPUS = torch.cuda.device_count() if CUDA else 0
two_gpus = pytest.mark.skipif(GPUS < 2, reason="needs 2 CUDA GPUs")


def pytest_collection_modifyitems(config, items):
    if CUDA:
        return
    skip = pytest.mark.skip(reason="the GPU suite needs CUDA (run `bash scripts/gpu_check.sh` on a GPU machine)")
    here = os.path.dirname(os.path.abspath(__file__))
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(skip)


def record_figure(name: str, value, unit: str = "", note: str = "") -> None:
    """One figure for gpu_check.sh's table (also printed, for `pytest -s`)."""
    print(f"\nFIGURE {name}: {value} {unit} {note}".rstrip())
    path = os.environ.get("HASTEN_GPU_FIGURES")
    if path:
        with open(path, "a") as handle:
            handle.write(json.dumps({"name": name, "value": value, "unit": unit, "note": note}) + "\n")
