"""Hooks that see keyword arguments, and the hooks that place and offload weights."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from big_model_zoo import Block, TinyLM
from hasten.hooks import (
    AlignDevicesHook,
    LayerwiseCastingHook,
    ModelHook,
    SequentialHook,
    add_hook_to_module,
    attach_align_device_hook,
    attach_align_device_hook_on_blocks,
    attach_execution_device_hook,
    remove_hook_from_module,
    remove_hook_from_submodules,
)


class AddOne(ModelHook):
    def pre_forward(self, module, *args, **kwargs):
        return (args[0] + 1,), kwargs


class Double(ModelHook):
    def post_forward(self, module, output):
        return output * 2


class ScaleKwarg(ModelHook):
    """Sees keyword arguments, which torch's own forward pre-hooks do not by default."""

    def pre_forward(self, module, x, scale=1.0):
        return (x,), {"scale": scale * 10}


class Scaled(nn.Module):
    def forward(self, x, scale=1.0):
        return x * scale


def test_hooks_wrap_and_unwrap_forward():
    layer = nn.Linear(3, 3)
    original = layer.forward
    x = torch.randn(2, 3)
    expected = layer(x + 1)
    add_hook_to_module(layer, AddOne())
    assert torch.allclose(layer(x), expected) and layer._old_forward == original
    add_hook_to_module(layer, Double())  # replaces the hook, keeps the original forward
    assert torch.allclose(layer(x), original(x) * 2)
    add_hook_to_module(layer, AddOne(), append=True)  # now Double then AddOne, in a SequentialHook
    assert isinstance(layer._hf_hook, SequentialHook)
    assert torch.allclose(layer(x), original(x + 1) * 2)
    remove_hook_from_module(layer)
    assert not hasattr(layer, "_hf_hook") and not hasattr(layer, "_old_forward")
    assert layer.forward == original and torch.allclose(layer(x), original(x))


def test_hooks_see_keyword_arguments_and_no_grad():
    module = Scaled()
    add_hook_to_module(module, ScaleKwarg())
    assert module(torch.ones(1), scale=2.0).item() == 20.0

    class NoGrad(ModelHook):
        no_grad = True

    layer = add_hook_to_module(nn.Linear(2, 2), NoGrad())
    assert not layer(torch.randn(1, 2)).requires_grad


def test_remove_hook_recursively():
    model = TinyLM()
    for module in model.modules():
        add_hook_to_module(module, Double())
    remove_hook_from_submodules(model)
    assert not any(hasattr(m, "_hf_hook") for m in model.modules())


def test_align_devices_hook_offloads_and_restores():
    torch.manual_seed(0)
    block = Block(8)
    x = torch.randn(2, 8)
    expected = block(x)
    add_hook_to_module(block, AlignDevicesHook(execution_device="cpu", offload=True, place_submodules=True))
    assert all(p.is_meta for p in block.parameters())
    assert torch.allclose(block(x), expected)
    assert all(p.is_meta for p in block.parameters())  # back on meta after the forward
    remove_hook_from_module(block)
    assert not any(p.is_meta for p in block.parameters()) and torch.allclose(block(x), expected)


def test_offload_buffers_and_non_persistent_buffers():
    norm = nn.BatchNorm1d(4).eval()
    norm.register_buffer("scratch", torch.ones(4), persistent=False)
    norm.running_mean += 1
    x = torch.randn(3, 4)
    expected = norm(x)
    add_hook_to_module(norm, AlignDevicesHook(execution_device="cpu", offload=True, offload_buffers=True))
    assert norm.running_mean.is_meta and not norm.scratch.is_meta  # non-persistent buffers stay
    assert torch.allclose(norm(x), expected)
    remove_hook_from_module(norm)
    kept = nn.BatchNorm1d(4)
    add_hook_to_module(kept, AlignDevicesHook(execution_device="cpu", offload=True))
    assert kept.weight.is_meta and not kept.running_mean.is_meta  # buffers are not offloaded by default


def test_io_same_device_and_skip_keys():
    class Passthrough(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(1))

        def forward(self, x, cache=None):
            return {"out": x * self.w, "cache": cache}

    module = Passthrough()
    marker = object()
    add_hook_to_module(module, AlignDevicesHook(execution_device="cpu", io_same_device=True, skip_keys="cache"))
    result = module(torch.ones(2), cache=marker)
    assert result["cache"] is marker and result["out"].device.type == "cpu"


def test_attach_helpers_and_blocks_offload_matches():
    torch.manual_seed(0)
    model = TinyLM().eval()
    ids = torch.randint(0, 64, (2, 5))
    expected = model(ids)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    attach_align_device_hook(model, execution_device="cpu", offload=True, weights_map=state)
    assert model.blocks[0].attn.weight.is_meta and model.blocks[0].mlp.up._hf_hook.offload
    assert torch.allclose(model(ids), expected)
    remove_hook_from_submodules(model)

    fresh = TinyLM().eval()
    fresh.load_state_dict(state)
    execution = {"embed": "cpu", "blocks": "cpu", "norm": "cpu", "head": "cpu", "": "cpu"}
    offload = {"embed": False, "blocks": True, "norm": False, "head": False}
    attach_align_device_hook_on_blocks(fresh, execution_device=execution, offload=offload, weights_map=state)
    assert fresh.blocks[1].attn.weight.is_meta and not fresh.embed.weight.is_meta
    assert fresh._hf_hook.io_same_device
    assert torch.allclose(fresh(ids), expected)

    plain = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.Linear(2, 2)))
    attach_execution_device_hook(plain, "cpu")
    assert [hasattr(m, "_hf_hook") for m in plain.modules()] == [True, True, True, True]


def test_layerwise_casting_hook():
    layer = nn.Linear(4, 4)
    x = torch.randn(2, 4)
    expected = layer(x)
    add_hook_to_module(layer, LayerwiseCastingHook(torch.bfloat16, torch.float32, non_blocking=False))
    assert layer.weight.dtype == torch.bfloat16
    assert torch.allclose(layer(x), expected, atol=0.05) and layer.weight.dtype == torch.bfloat16

    from hasten.big_modeling import attach_layerwise_casting_hooks

    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4), nn.Sequential(nn.Linear(4, 4)))
    attach_layerwise_casting_hooks(model, torch.float16, torch.float32, skip_modules_pattern=["^2"])
    assert model[0].weight.dtype == torch.float16 and model[1].weight.dtype == torch.float32
    assert model[2][0].weight.dtype == torch.float32
    assert model(torch.randn(1, 4)).dtype == torch.float32


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_align_devices_hook_moves_to_gpu_and_back():
    layer = nn.Linear(3, 3)
    add_hook_to_module(layer, AlignDevicesHook(execution_device=0, io_same_device=True))
    assert layer.weight.device.type == "cuda"
    assert layer(torch.randn(1, 3)).device.type == "cpu"
