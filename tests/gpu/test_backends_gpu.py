"""Every backend on the device at hand: prepare -> 20 steps that track a plain-PyTorch reference -> save_state ->
load_state -> identical continuation. On one GPU each backend runs in one process under torchrun (NCCL); in CI
the CPU twin runs two gloo processes."""

from __future__ import annotations

import importlib.util

import pytest
from gpu_suite import CUDA, GPUS, launch_world, processes

needs_deepspeed = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="deepspeed is not installed")
CASES = [
    pytest.param("ddp", id="ddp"),
    pytest.param("fsdp1", id="fsdp1"),
    pytest.param("fsdp2", id="fsdp2"),
    pytest.param("tp", id="tp", marks=pytest.mark.skipif(CUDA and GPUS < 2, reason="tensor parallelism needs 2 "
                                                                                  "CUDA GPUs (its CPU twin runs in CI)")),
    pytest.param("zero2", id="deepspeed-zero2", marks=needs_deepspeed),
    pytest.param("zero3", id="deepspeed-zero3", marks=needs_deepspeed),
]


@pytest.mark.parametrize("backend", CASES)
def test_round_trip_tracks_the_reference_and_continues_identically(backend, tmp_path):
    result = launch_world("gpu_roundtrip.py", backend, tmp_path, num_processes=processes(), timeout=300)
    assert result.stdout.count("round trip identical") == processes(), result.stdout + result.stderr
