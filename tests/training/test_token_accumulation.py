"""Token-normalised gradient accumulation: the opt-in and its refusals in this process; DDP and FSDP2 windows
(with the shorter last window of an epoch) in real processes (tests/workers/token_accumulation.py)."""

from __future__ import annotations

import pytest
import torch

from hasten import Accelerator, GradientAccumulationPlugin
from hasten.core.errors import ConfigError
from launching import launch


def test_off_by_default_and_read_from_the_setting(monkeypatch):
    assert GradientAccumulationPlugin().normalize_by_tokens is False
    monkeypatch.setenv("HASTEN_GRADIENT_ACCUMULATION_NORMALIZE_BY_TOKENS", "true")
    assert GradientAccumulationPlugin().normalize_by_tokens is True
    assert GradientAccumulationPlugin(normalize_by_tokens=False).normalize_by_tokens is False  # code wins


def test_one_process_window_is_the_token_mean():
    acc = Accelerator(gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=2, normalize_by_tokens=True))
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    model = acc.prepare(model)
    xs = [torch.randn(5, 3), torch.randn(1, 3)]
    for x in xs:
        with acc.accumulate(model):
            acc.backward(model(x).pow(2).mean(), num_items_in_batch=x.shape[0])
    expected = torch.autograd.grad(model(torch.cat(xs)).pow(2).mean(), model.weight)[0]
    assert torch.allclose(model.weight.grad, expected, atol=1e-7)


def test_the_hook_is_refused_in_one_line_when_misused():
    acc = Accelerator(gradient_accumulation_plugin=GradientAccumulationPlugin(normalize_by_tokens=True))
    model = acc.prepare(torch.nn.Linear(2, 1))
    with pytest.raises(ConfigError, match="needs the number of items") as error:
        acc.backward(model(torch.ones(1, 2)).sum())
    assert "\n" not in str(error.value)
    from hasten.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    plain = Accelerator()
    with pytest.raises(ConfigError, match="is for token-normalised accumulation"):
        plain.backward(torch.ones((), requires_grad=True), num_items_in_batch=3)


def test_ddp_and_fsdp2_windows_equal_one_process_on_all_tokens(tmp_path):
    """GA=4 on 2 processes, variable lengths, a shorter last window: the gradient equals one process's on the whole
    window's tokens within 1e-6 (DDP and FSDP2); the default mean of means is Accelerate's and differs (> 1e-3)."""
    result = launch("token_accumulation.py", timeout=240)
    assert "NAIVE OK DDP" in result.stdout
    assert "TOKEN OK DDP" in result.stdout and "TOKEN OK FSDP2" in result.stdout
