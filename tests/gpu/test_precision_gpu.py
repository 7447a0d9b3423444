"""fp16 (plain and fused AdamW, an injected overflow: step skipped, scheduler held) and bf16 autocast on CUDA."""

from __future__ import annotations

import pytest
import torch

from hasten import Accelerator
from hasten.utils import GradScalerKwargs


@pytest.mark.parametrize("fused", [False, True], ids=["adamw", "fused-adamw"])
def test_fp16_overflow_skips_step_and_holds_scheduler(fused):
    acc = Accelerator(mixed_precision="fp16", kwargs_handlers=[GradScalerKwargs(init_scale=1024.0)])
    model = torch.nn.Linear(16, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, fused=fused)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)
    model, opt, sched = acc.prepare(model, opt, sched)
    assert next(model.parameters()).device.type == "cuda"
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


def test_bf16_autocast_runs_matmuls_in_bf16():
    acc = Accelerator(mixed_precision="bf16")
    model = acc.prepare(torch.nn.Linear(16, 16))
    out = model(torch.randn(2, 16, device=acc.device))
    assert out.dtype == torch.bfloat16 and out.device.type == "cuda"
