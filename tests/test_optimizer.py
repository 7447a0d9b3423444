"""AcceleratedOptimizer: fp16 steps skipped on overflow, whatever kind of optimizer (issue 22, item 3)."""

from __future__ import annotations

import pytest
import torch

from hasten import Accelerator
from hasten.utils import GradScalerKwargs


def _run(make_optimizer):
    acc = Accelerator(mixed_precision="fp16", kwargs_handlers=[GradScalerKwargs(init_scale=1024.0)])
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = make_optimizer(model.parameters())
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)
    model, opt, sched = acc.prepare(model, opt, sched)
    before = [p.detach().clone() for p in model.parameters()]
    acc.backward(model(torch.randn(2, 4)).sum() * float("inf"))  # the injected overflow
    opt.step()
    sched.step()
    skipped = (acc.optimizer_step_was_skipped, opt.step_was_skipped, sched.get_last_lr()[0],
               all(torch.equal(a, b) for a, b in zip(before, model.parameters())), acc.scaler.get_scale())
    opt.zero_grad()
    acc.backward(model(torch.randn(2, 4)).float().pow(2).mean())
    opt.step()
    sched.step()
    taken = (acc.optimizer_step_was_skipped, sched.get_last_lr()[0],
             any(not torch.equal(a, b) for a, b in zip(before, model.parameters())))
    return skipped, taken


@pytest.mark.parametrize("make_optimizer, fused", [
    pytest.param(lambda params: torch.optim.AdamW(params, lr=0.1), False, id="plain-adamw"),
    pytest.param(lambda params: torch.optim.AdamW(params, lr=0.1, fused=True), True, id="fused-adamw"),
    pytest.param(lambda params: torch.optim.SGD(params, lr=0.1, fused=True), True, id="fused-sgd"),
])
def test_fp16_overflow_is_reported_skipped_and_holds_the_scheduler(make_optimizer, fused):
    probe = make_optimizer([torch.nn.Parameter(torch.zeros(1))])
    # A fused optimizer is always stepped by the scaler (it skips inside): the case a "did step() run" marker misses.
    assert getattr(probe, "_step_supports_amp_scaling", False) == fused
    (was_skipped, opt_skipped, lr, unchanged, scale), (was_skipped_after, lr_after, moved) = _run(make_optimizer)
    assert was_skipped and opt_skipped
    assert lr == 0.1  # the scheduler held on the skipped step
    assert unchanged and scale == 512.0
    assert not was_skipped_after and lr_after == 0.05 and moved


def test_fsdp1_fp16_fused_optimizer_skips_on_every_rank_when_one_overflows():
    """Issue 30, item 9: torch's ShardedGradScaler shares the overflow flag across ranks in unscale_(), which the
    fused path skips; the rank without an inf stepped while the other skipped."""
    from launching import launch

    result = launch("fsdp_fp16_fused_overflow.py", num_processes=2, timeout=240)
    assert result.stdout.count("overflow skipped on every rank") == 2, result.stdout + result.stderr
    assert result.stdout.count("clipped fused step taken") == 2, result.stdout + result.stderr
