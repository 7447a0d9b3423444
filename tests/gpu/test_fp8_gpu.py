"""fp8 training on a GPU that can run it (compute capability >= 8.9, torchao installed); skipped elsewhere.

tests/workers/fp8_train.py trains a small transformer ~100 steps in bf16 and then in fp8 (torchao) from the same
seed and data, and fails unless fp8's loss, averaged over each window of 10 steps, stays within 10% (+0.05 nats) of
bf16's; the step-time ratio is printed
(`pytest -s`).
"""

import json

import pytest
import torch
from launching import launch

from hasten.core.availability import is_torchao_available

FP8_GPU = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)
pytestmark = pytest.mark.skipif(not FP8_GPU or not is_torchao_available(),
                                reason="needs a CUDA GPU with compute capability >= 8.9 and torchao")


@pytest.mark.parametrize("flags", [[], ["--use_fsdp", "--fsdp_version", "2"]], ids=["one process", "fsdp2"])
def test_fp8_torchao_tracks_bf16(flags):
    result = launch("fp8_train.py", 100, num_processes=1, flags=flags, timeout=600)
    assert "fp8 tracked bf16" in result.stdout
    report = json.loads(next(line for line in result.stdout.splitlines() if line.startswith("{")))
    print(f"\n{report['distributed_type']}: fp8/bf16 step time {report['fp8_over_bf16_step_time']:.3f} "
          f"(bf16 {report['bf16_step_s'] * 1e3:.2f} ms, fp8 {report['fp8_step_s'] * 1e3:.2f} ms); final loss "
          f"bf16 {report['bf16_losses'][-1]:.4f}, fp8 {report['fp8_losses'][-1]:.4f}")
