"""`AcceleratedScheduler`: torch's "scheduler before optimizer" warning is silenced for that call only."""

from __future__ import annotations

import importlib
import warnings

import torch


def test_no_process_wide_warning_filter_and_the_first_step_is_quiet():
    import hasten.scheduler as scheduler_module

    importlib.reload(scheduler_module)
    assert not [f for f in warnings.filters if "lr_scheduler" in str(getattr(f[3], "pattern", f[3]))]
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    wrapped = scheduler_module.AcceleratedScheduler(scheduler, [optimizer], step_with_optimizer=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        wrapped.step()  # before any optimizer step: torch would warn
    assert not [w for w in caught if "lr_scheduler.step()" in str(w.message)]
    with warnings.catch_warnings(record=True) as caught:  # the user's own scheduler still warns
        warnings.simplefilter("always")
        torch.optim.lr_scheduler.StepLR(torch.optim.SGD(model.parameters(), lr=0.1), step_size=1).step()
    assert [w for w in caught if "lr_scheduler.step()" in str(w.message)]
