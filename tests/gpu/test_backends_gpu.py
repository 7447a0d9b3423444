"""Every backend on CUDA: prepare -> 20 steps -> save_state -> load_state -> identical continuation."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from conftest import GPUS
from launching import launch

CASES = [
    pytest.param("ddp", id="ddp"),
    pytest.param("fsdp1", id="fsdp1"),
    pytest.param("fsdp2", id="fsdp2"),
    pytest.param("tp", id="tp", marks=pytest.mark.skipif(GPUS < 2, reason="tensor parallelism needs 2 CUDA GPUs")),
    pytest.param("zero2", id="deepspeed-zero2", marks=pytest.mark.skipif(
        importlib.util.find_spec("deepspeed") is None, reason="deepspeed is not installed")),
    pytest.param("zero3", id="deepspeed-zero3", marks=pytest.mark.skipif(
        importlib.util.find_spec("deepspeed") is None, reason="deepspeed is not installed")),
]


@pytest.mark.parametrize("backend", CASES)
def test_round_trip_continues_identically(backend, tmp_path):
    processes = min(2, max(1, torch.cuda.device_count()))
    result = launch("gpu_roundtrip.py", backend, tmp_path, num_processes=processes, timeout=300)
    assert result.stdout.count("round trip identical") == processes, result.stdout + result.stderr
