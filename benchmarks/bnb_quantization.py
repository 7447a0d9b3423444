"""Memory and output error of bitsandbytes-quantized models against the fp32 model (docs/low_precision.md).

    python benchmarks/bnb_quantization.py [--width 1024 --hidden 4096 --blocks 4]

A residual MLP (`--blocks` blocks of Linear(width, hidden) and Linear(hidden, width), an input projection and an
output head) is saved as safetensors, then loaded with `load_and_quantize_model` in each setting from an empty
model. Printed per setting: bytes of the parameters (and with the quantization statistics), their ratio to fp32,
the relative L2 error of the output against the fp32 model, and the load time. Needs `pip install "hasten[bnb]"`.
No Accelerate column: Accelerate 1.15 refuses to quantize without a GPU. Not in `python -m benchmarks` (it would
make every run install and import bitsandbytes).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, width, hidden):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, hidden)
        self.fc2 = nn.Linear(hidden, width)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(self.norm(x))))


class Net(nn.Module):
    def __init__(self, width, hidden, blocks):
        super().__init__()
        self.proj = nn.Linear(width, width)
        self.blocks = nn.ModuleList([Block(width, hidden) for _ in range(blocks)])
        self.head = nn.Linear(width, width)

    def forward(self, x):
        x = self.proj(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def statistics_bytes(model, bnb) -> int:
    total = 0
    for module in model.modules():
        if isinstance(module, bnb.nn.Linear8bitLt):
            scales = module.weight.SCB if module.weight.SCB is not None else module.state.SCB
            total += scales.numel() * scales.element_size()
        elif isinstance(module, bnb.nn.Linear4bit):
            state = module.weight.quant_state
            tensors = [state.absmax, state.code] + ([state.state2.absmax, state.state2.code] if state.nested else [])
            total += sum(t.numel() * t.element_size() for t in tensors)
    return total


def parameter_bytes(model) -> int:
    return sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args(argv)

    from safetensors.torch import save_file

    from hasten import init_empty_weights
    from hasten.utils.bnb import BnbQuantizationConfig, load_and_quantize_model

    started = time.perf_counter()
    import bitsandbytes as bnb

    import_seconds = time.perf_counter() - started
    torch.manual_seed(0)
    reference = Net(args.width, args.hidden, args.blocks).eval()
    inputs = torch.randn(args.batch, args.width)
    with torch.no_grad():
        expected = reference(inputs)
    fp32_bytes = parameter_bytes(reference)
    settings = [
        ("8-bit (LLM.int8, fp16 rest)", dict(load_in_8bit=True)),
        ("4-bit nf4", dict(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype="fp32")),
        ("4-bit nf4 + double quant", dict(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                          bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype="fp32")),
        ("4-bit fp4", dict(load_in_4bit=True, bnb_4bit_quant_type="fp4", bnb_4bit_compute_dtype="fp32")),
        ("4-bit fp4 + double quant", dict(load_in_4bit=True, bnb_4bit_quant_type="fp4",
                                          bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype="fp32")),
    ]
    print(f"### bitsandbytes {bnb.__version__} on {'CUDA' if torch.cuda.is_available() else 'CPU'}: "
          f"width {args.width}, hidden {args.hidden}, {args.blocks} blocks, fp32 parameters {fp32_bytes:,} bytes "
          f"(import bitsandbytes: {import_seconds:.1f} s)\n")
    print("| setting | parameter bytes | + statistics | vs fp32 | output rel. error | load s |")
    print("| --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as folder:
        save_file({k: v.contiguous() for k, v in reference.state_dict().items()},
                  os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
        for title, kwargs in settings:
            config = BnbQuantizationConfig(**kwargs)
            with init_empty_weights():
                model = Net(args.width, args.hidden, args.blocks)
            started = time.perf_counter()
            model = load_and_quantize_model(model, config, weights_location=folder).eval()
            load_seconds = time.perf_counter() - started
            # before the first forward, which on AVX512-BF16 CPUs repacks 4-bit weights (bf16 block scales)
            params = parameter_bytes(model)
            total = params + statistics_bytes(model, bnb)
            with torch.no_grad():
                output = model(inputs.to(config.torch_dtype)).float()
            error = ((output - expected).norm() / expected.norm()).item()
            print(f"| {title} | {params:,} | {total:,} | {total / fp32_bytes:.3f} | {error:.4f} | {load_seconds:.2f} |")


if __name__ == "__main__":
    main()
