"""hasten.local_sgd.LocalSGD: argument checks in one process, and the averaging on 2 real processes."""

from __future__ import annotations

import re

import pytest
import torch

from hasten import Accelerator
from hasten.core.errors import ConfigError
from hasten.local_sgd import LocalSGD
from launching import launch


def test_one_process_is_a_no_op():
    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(torch.nn.Linear(2, 2))
    before = [p.detach().clone() for p in model.parameters()]
    with LocalSGD(accelerator, model, local_sgd_steps=1) as local_sgd:
        assert not local_sgd.enabled
        local_sgd.step()
    assert local_sgd.num_steps == 1
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_refuses_a_step_count_below_one():
    accelerator = Accelerator(cpu=True)
    with pytest.raises(ConfigError, match="local_sgd_steps >= 1"):
        LocalSGD(accelerator, torch.nn.Linear(2, 2), local_sgd_steps=0)


def test_averages_every_k_steps_on_two_processes():
    result = launch("local_sgd_train.py")
    passed = re.findall(r"CHECKS-PASSED (\d) (\d+)", result.stdout)
    assert sorted(rank for rank, _ in passed) == ["0", "1"], result.stdout + result.stderr
    assert all(int(count) == 28 for _, count in passed), passed
