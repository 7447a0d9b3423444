"""fp16 (plain and fused AdamW, an injected overflow: step skipped, scheduler held) and bf16 autocast, on the
device at hand (the CPU twin runs in CI; only "the parameters are on CUDA" is skipped there)."""

from __future__ import annotations

import pytest
import torch
from gpu_suite import CUDA

from hasten import Accelerator
from hasten.utils import GradScalerKwargs


@pytest.mark.parametrize("fused", [False, True], ids=["adamw", "fused-adamw"])
def test_fp16_overflow_skips_step_and_holds_scheduler(fused):
    acc = Accelerator(mixed_precision="fp16", kwargs_handlers=[GradScalerKwargs(init_scale=1024.0)])
    model = torch.nn.Linear(16, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, fused=fused)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)
    model, opt, sched = acc.prepare(model, opt, sched)
    assert next(model.parameters()).device.type == ("cuda" if CUDA else "cpu")
    before = [p.detach().clone() for p in model.parameters()]
    acc.backward(model(torch.randn(2, 16, device=acc.device)).float().sum() * float("inf"))
    opt.step()
    sched.step()
    assert acc.optimizer_step_was_skipped and sched.get_last_lr()[0] == 0.1
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    opt.zero_grad()
    acc.backward(model(torch.randn(2, 16, device=acc.device)).float().pow(2).mean())
    opt.step()
    sched.step()
    assert not acc.optimizer_step_was_skipped and sched.get_last_lr()[0] == 0.05


def test_bf16_autocast_runs_matmuls_in_bf16_and_returns_fp32():
    """The matmul runs in bf16 inside the forward; the prepared model's output is converted to fp32, as
    Accelerate's `convert_outputs_to_fp32` (the old expectation of a bf16 output was the test's own mistake)."""
    acc = Accelerator(mixed_precision="bf16")
    model = acc.prepare(torch.nn.Sequential(torch.nn.Linear(16, 16)))
    seen = []
    acc.unwrap_model(model)[0].register_forward_hook(lambda module, args, output: seen.append(output.dtype))
    out = model(torch.randn(2, 16, device=acc.device))
    assert seen == [torch.bfloat16], seen
    assert out.dtype == torch.float32 and out.device.type == acc.device.type
