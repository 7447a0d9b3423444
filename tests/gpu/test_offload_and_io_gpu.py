"""CUDA paths of offloading and checkpoint I/O: FSDP2 cpu_ram_efficient_loading + cpu_offload (issue 22 item 4,
issue 30 items 7-8), async save from device tensors, device maps over cuda/cpu/disk equal to the full model,
bitsandbytes on CUDA. Each has a CPU twin that CI runs (what only the GPU runs is said at each case)."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from gpu_suite import CUDA, device_only_skips, launch_world, processes

from hasten import Accelerator


def test_fsdp2_ram_efficient_loading_with_cpu_offload_keeps_shards_on_cpu(tmp_path):
    result = launch_world("gpu_offload.py", num_processes=processes(), timeout=300)
    assert result.stdout.count("offload checks passed") == processes(), result.stdout + result.stderr
    assert device_only_skips(result) == (0 if CUDA else 2 * processes()), result.stdout


def test_async_save_from_cuda_commits_and_loads(tmp_path):
    acc = Accelerator()
    model = torch.nn.Linear(32, 32)
    opt = torch.optim.AdamW(model.parameters())
    model, opt = acc.prepare(model, opt)
    acc.backward(model(torch.randn(4, 32, device=acc.device)).pow(2).mean())
    opt.step()
    saved = {k: v.detach().clone() for k, v in model.state_dict().items()}
    acc.save_state(str(tmp_path / "ckpt"), async_save=True)
    # A step right after the call returns (it waits for the background copy to take the weights; a change made
    # outside optimizer.step() is refused, as the CPU twin found): the checkpoint must hold the old values.
    acc.backward(model(torch.randn(4, 32, device=acc.device)).pow(2).mean())
    opt.step()
    assert any(not torch.equal(saved[k], v) for k, v in model.state_dict().items())
    acc.wait_for_checkpoint()
    acc.load_state(str(tmp_path / "ckpt"))
    assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items())


def test_device_map_over_cuda_cpu_and_disk_equals_the_full_model(tmp_path):
    """On a GPU: block 1 is kept in CPU memory and block 2 on disk, both run on cuda:0 through the weights map, and
    their two hooks are linked to prefetch each other's weights. The CPU twin: main memory stands in for the GPU, so
    a block mapped to "cpu" is simply there; blocks 1 and 2 both go to disk, so two offloading hooks, the weights
    map and the prefetch link run as on the GPU. Only a CPU-kept block copied to cuda:0 at each forward is the
    GPU's alone."""
    from hasten.big_modeling import dispatch_model
    from hasten.hooks import _offload_hook

    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(64, 64) for _ in range(4))).eval()
    x = torch.randn(3, 64)
    with torch.no_grad():
        expected = model(x)
    device = 0 if CUDA else "cpu"
    device_map = {"0": device, "1": "cpu" if CUDA else "disk", "2": "disk", "3": device}
    dispatched = dispatch_model(model, device_map, offload_dir=str(tmp_path / "offload"))
    hooks = [hook for module in dispatched.modules() if (hook := _offload_hook(module)) is not None]
    assert len(hooks) == 2 and all(hook.prefetch_next is not None for hook in hooks)
    with torch.no_grad():
        got = dispatched(x.to("cuda:0" if CUDA else "cpu"))
    assert got.device.type == ("cuda" if CUDA else "cpu")
    torch.testing.assert_close(got.cpu(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is None, reason="bitsandbytes is not installed (on the "
                    "GPU machine: it cannot travel, its CUDA builds are past 64 MiB)")
@pytest.mark.parametrize("bits", [8, 4])
def test_bnb_quantized_linear_runs_on_the_device_close_to_full(bits, tmp_path):
    """On a GPU, bitsandbytes' CUDA kernels; the CPU twin, its CPU ones (the same hasten code: replace, quantize,
    dispatch)."""
    from hasten.utils import BnbQuantizationConfig, load_and_quantize_model

    device = "cuda" if CUDA else "cpu"
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8)).half()
    x = torch.randn(4, 256, dtype=torch.float16)
    with torch.no_grad():
        expected = model.to(device)(x.to(device)).float()
    config = BnbQuantizationConfig(load_in_8bit=bits == 8, load_in_4bit=bits == 4)
    quantized = load_and_quantize_model(model, bnb_quantization_config=config,
                                        device_map={"": 0 if CUDA else "cpu"})
    with torch.no_grad():
        got = quantized(x.to(device)).float()
    assert got.device.type == device
    assert (got - expected).abs().mean() / expected.abs().mean() < (0.05 if bits == 8 else 0.2)
