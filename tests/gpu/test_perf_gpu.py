"""Two performance rows, measured side by side in one run: a bf16 training step, hasten over raw PyTorch (goal
<= 1.01, fails past 1.05), and big-model time to first output, hasten against Accelerate (when installed). The
figures go to gpu_check.sh's table, recorded before any check, so a miss still reports its ratio.

The step is GPU-bound: a few wide matmuls (8192 x 8192 weights, 8192 tokens: about 17 ms of GPU work a step on an
H100/H200) against about 60 kernel launches, so what is timed is the work and hasten's overhead around it, not launch
jitter (a 6-layer 512-wide transformer gave ~1-2 ms of GPU work against ~700 launches). Raw and hasten rounds
alternate (raw, hasten, raw, hasten, ...), so clock and thermal drift hit both alike; each side's figure is the
median of its rounds.

The CPU twin (CI) runs the same code with a tiny model and two short rounds, and records the figures; the timing
checks are made on a GPU only (CI has no timing thresholds).
"""

from __future__ import annotations

import importlib.util
import statistics
import subprocess
import sys
import time

import pytest
import torch
from gpu_suite import CUDA, record_figure

from hasten import Accelerator

DEVICE = "cuda" if CUDA else "cpu"
# width, layers, tokens; rounds of steps per side, warm-up steps
WIDTH, LAYERS, TOKENS = (8192, 4, 8192) if CUDA else (64, 2, 32)
ROUNDS, STEPS, WARMUP = (6, 10, 5) if CUDA else (2, 2, 1)
GOAL, LIMIT = 1.01, 1.05


def _model():
    torch.manual_seed(0)
    layers = []
    for _ in range(LAYERS):
        layers += [torch.nn.Linear(WIDTH, WIDTH, bias=False), torch.nn.GELU()]
    return torch.nn.Sequential(*layers)


def _synchronize():
    if CUDA:
        torch.cuda.synchronize()


def _round(step) -> float:
    """Seconds a step, over one round of STEPS steps."""
    _synchronize()
    start = time.perf_counter()
    for _ in range(STEPS):
        step()
    _synchronize()
    return (time.perf_counter() - start) / STEPS


def interleaved(raw_step, hasten_step) -> tuple[float, float]:
    """(raw, hasten) seconds a step: each side warmed up, then ROUNDS rounds each, alternating; medians."""
    for _ in range(WARMUP):
        raw_step()
        hasten_step()
    raw, ours = [], []
    for _ in range(ROUNDS):
        raw.append(_round(raw_step))
        ours.append(_round(hasten_step))
    return statistics.median(raw), statistics.median(ours)


def test_bf16_step_hasten_over_raw():
    x = torch.randn(TOKENS, WIDTH, device=DEVICE)
    raw_model = _model().to(DEVICE)
    raw_opt = torch.optim.AdamW(raw_model.parameters(), lr=1e-4, fused=CUDA)

    def raw_step():
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            loss = raw_model(x).float().pow(2).mean()
        loss.backward()
        raw_opt.step()
        raw_opt.zero_grad(set_to_none=True)

    acc = Accelerator(mixed_precision="bf16")
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=CUDA)
    model, opt = acc.prepare(model, opt)

    def hasten_step():
        loss = model(x).float().pow(2).mean()
        acc.backward(loss)
        opt.step()
        opt.zero_grad(set_to_none=True)

    raw, ours = interleaved(raw_step, hasten_step)
    ratio = ours / raw
    record_figure(f"bf16 step hasten/raw ({DEVICE})", round(ratio, 4), "x",
                  f"hasten {ours * 1e3:.2f} ms, raw {raw * 1e3:.2f} ms, medians of {ROUNDS} interleaved rounds of "
                  f"{STEPS} steps; goal <= {GOAL}")
    if CUDA:
        assert ratio <= LIMIT, f"hasten/raw {ratio:.4f} > {LIMIT} (hasten {ours * 1e3:.2f} ms, raw {raw * 1e3:.2f} ms)"


TTFO = r"""
import sys, time, torch
start = time.perf_counter()
from importlib import import_module
big = import_module(sys.argv[1] + ".big_modeling")
width, layers, device = int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
with big.init_empty_weights():
    model = torch.nn.Sequential(*(torch.nn.Linear(width, width) for _ in range(layers)))
model = big.load_checkpoint_and_dispatch(model, sys.argv[2], device_map="auto")
with torch.no_grad():
    model(torch.randn(1, width, device=device))
if device.startswith("cuda"):
    torch.cuda.synchronize()
print(time.perf_counter() - start)
"""


@pytest.mark.skipif(importlib.util.find_spec("safetensors") is None, reason="safetensors is not installed")
def test_big_model_time_to_first_output_against_accelerate(tmp_path):
    """Each library in a fresh process: import, an empty model, `load_checkpoint_and_dispatch(device_map="auto")`,
    one forward. Two rounds, alternating the libraries; the second reads from a warm page cache for both."""
    from safetensors.torch import save_file

    width, layers = (4096, 12) if CUDA else (256, 4)  # ~0.8 GB fp32 on a GPU
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(width, width) for _ in range(layers)))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, tmp_path / "model.safetensors")
    del model
    libraries = ["hasten"] + (["accelerate"] if importlib.util.find_spec("accelerate") else [])
    times = {}
    for _ in range(2):
        for library in libraries:
            out = subprocess.run([sys.executable, "-c", TTFO, library, str(tmp_path / "model.safetensors"), str(width),
                                  str(layers), "cuda:0" if CUDA else "cpu"], capture_output=True, text=True,
                                 timeout=120)
            assert out.returncode == 0, out.stderr
            times[library] = float(out.stdout.strip().splitlines()[-1])
    note = ", ".join(f"{k} {v:.2f} s" for k, v in times.items()) + f" ({DEVICE})"
    if "accelerate" in times:
        record_figure("big-model time to first output hasten/accelerate", round(times["hasten"] / times["accelerate"], 3),
                      "x", note)
    else:
        record_figure("big-model time to first output (accelerate not installed)", round(times["hasten"], 2), "s", note)


def test_raw_and_hasten_rounds_alternate():
    """Issue 41 item 4: all raw rounds used to run before all hasten rounds, so drift favoured one side."""
    calls = []
    interleaved(lambda: calls.append("raw"), lambda: calls.append("hasten"))
    rounds = [calls[i] for i in range(2 * WARMUP, len(calls), STEPS)]
    assert rounds == ["raw", "hasten"] * ROUNDS
    assert calls[:2 * WARMUP] == ["raw", "hasten"] * WARMUP
