"""fp8 (torchao) training tracks bf16: one process, and FSDP2 with the launcher's defaults (`--use_fsdp` turns on
cpu_ram_efficient_loading, as Accelerate's launcher does; fp8 layers are swapped before rank 0 streams its weights).

tests/workers/fp8_train.py trains a small transformer in bf16 and then in fp8 from the same seed and data, and fails
unless fp8's loss, averaged over each window of 10 steps, stays within 10% (+0.05 nats) of bf16's; the step-time ratio
is printed (`pytest -s`). On a GPU of compute capability >= 8.9: 100 steps, fp8 kernels. The CPU twin (CI): 30 steps
of a smaller model, two processes for FSDP2, torchao's fp8 layers with torch's CPU float8 matmul; only the
check that the device runs fp8 kernels is skipped there.
"""

import json

import pytest
import torch
from gpu_suite import CUDA, device_only_skips, processes
from launching import launch

from hasten.core.availability import is_torchao_available

FP8_GPU = CUDA and torch.cuda.get_device_capability() >= (8, 9)
pytestmark = [
    pytest.mark.skipif(not is_torchao_available(),
                       reason="torchao is not installed (carried in .whl/ to the GPU machine)"),
    pytest.mark.skipif(CUDA and not FP8_GPU, reason="needs a CUDA GPU with compute capability >= 8.9"),
]
STEPS = 100 if CUDA else 30


@pytest.mark.parametrize("fsdp", [False, True], ids=["one-process", "fsdp2"])
def test_fp8_torchao_tracks_bf16(fsdp):
    flags = ["--use_fsdp", "--fsdp_version", "2"] if fsdp else []
    count = processes() if fsdp else 1
    result = launch("fp8_train.py", STEPS, num_processes=count, flags=flags, timeout=600)
    assert "fp8 tracked bf16" in result.stdout
    assert device_only_skips(result) == (0 if CUDA else count), result.stdout
    # the report is rank 0's one line; another rank's words may share that line of the joined output
    line = next(line for line in result.stdout.splitlines() if '{"distributed_type"' in line)
    report, _ = json.JSONDecoder().raw_decode(line, line.index('{"distributed_type"'))
    # the launcher's FSDP default, as a user's `accelerate launch --use_fsdp` run gets it
    assert report["ram_efficient_loading"] is fsdp
    print(f"\n{report['distributed_type']}: fp8/bf16 step time {report['fp8_over_bf16_step_time']:.3f} "
          f"(bf16 {report['bf16_step_s'] * 1e3:.2f} ms, fp8 {report['fp8_step_s'] * 1e3:.2f} ms); final loss "
          f"bf16 {report['bf16_losses'][-1]:.4f}, fp8 {report['fp8_losses'][-1]:.4f}")
