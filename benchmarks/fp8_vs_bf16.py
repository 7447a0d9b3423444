"""Training step time of fp8 (torchao float8) against bf16 on one GPU: raw torchao, hasten and Accelerate.

Needs a CUDA GPU with compute capability >= 8.9 (H100, L4, RTX 4090, ...) and torchao; anywhere else it says so and
exits with status 2. Each side trains the same transformer (the first and last Linear layers stay in bf16, as in
Accelerate) for `--steps` timed steps after warm-up; bf16 and fp8 are interleaved, and the table gives the median
step time, fp8/bf16 per side and each side against raw torchao. Run: `python -m benchmarks.fp8_vs_bf16 [--quick]`.
"""

from __future__ import annotations

import os
import sys
import time

if __package__ in (None, ""):  # run as `python benchmarks/fp8_vs_bf16.py`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks._common import (
    ACCELERATE, ACCELERATE_LEFT_OUT, HASTEN, Table, base_parser, fmt_time, interleave, median, print_tables, ratio,
    want_accelerate,
)
from benchmarks._launch import mlp_blocks

RAW_AO = "raw torchao"


def cannot_run() -> str | None:
    """Why this machine cannot run the benchmark, or None."""
    import torch

    from hasten.core.availability import is_torchao_available

    if not torch.cuda.is_available():
        return "no CUDA GPU found"
    capability = torch.cuda.get_device_capability()
    if capability < (8, 9):
        return f"{torch.cuda.get_device_name()} has compute capability {capability[0]}.{capability[1]}"
    if not is_torchao_available():
        return 'torchao is not installed (pip install "hasten[fp8]")'
    return None


def build_model(width: int, depth: int):
    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.first = torch.nn.Linear(width, width)
            self.blocks = torch.nn.ModuleList(mlp_blocks(width, depth))
            self.last = torch.nn.Linear(width, width)

        def forward(self, x):
            x = self.first(x)
            for block in self.blocks:
                x = block(x)
            return self.last(x).float().pow(2).mean()

    return Net()


def _time_steps(step, steps: int) -> float:
    import torch

    for _ in range(3):  # warm-up (fp8 scaling kernels, allocator)
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps


def raw_torchao(precision, width, depth, batch, steps) -> float:
    import torch
    from torchao.float8 import convert_to_float8_training

    torch.manual_seed(0)
    model = build_model(width, depth).cuda()
    if precision == "fp8":
        names = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
        convert_to_float8_training(model, module_filter_fn=lambda m, fqn: fqn not in (names[0], names[-1]))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(batch, width, device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    return _time_steps(step, steps)


def framework(accelerator_cls, reset, handlers_for):
    def measure(precision, width, depth, batch, steps) -> float:
        import torch

        reset()
        handlers = handlers_for() if precision == "fp8" else []
        accelerator = accelerator_cls(mixed_precision=precision, kwargs_handlers=handlers)
        torch.manual_seed(0)
        model = build_model(width, depth)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        model, optimizer = accelerator.prepare(model, optimizer)
        x = torch.randn(batch, width, device=accelerator.device)

        def step():
            accelerator.backward(model(x))
            optimizer.step()
            optimizer.zero_grad()

        return _time_steps(step, steps)

    return measure


def run(args):
    from hasten import Accelerator
    from hasten.state import AcceleratorState
    from hasten.utils import AORecipeKwargs

    width, depth, batch = (256, 2, 256) if args.quick else (args.width, args.depth, args.batch)
    steps, repeats = (5, 1) if args.quick else (args.steps, args.repeats or 3)
    sides = {
        RAW_AO: raw_torchao,
        HASTEN: framework(Accelerator, lambda: AcceleratorState._reset_state(reset_partial_state=True),
                          lambda: [AORecipeKwargs()]),
    }
    if want_accelerate(args):
        from accelerate import Accelerator as AccelerateAccelerator
        from accelerate.state import AcceleratorState as AccelerateState
        from accelerate.utils import AORecipeKwargs as AccelerateAORecipeKwargs

        sides[ACCELERATE] = framework(AccelerateAccelerator, lambda: AccelerateState._reset_state(True),
                                      lambda: [AccelerateAORecipeKwargs()])
    runs = {f"{side}|{precision}": (lambda f=fn, p=precision: f(p, width, depth, batch, steps))
            for side, fn in sides.items() for precision in ("bf16", "fp8")}
    samples = {key: median(values) for key, values in interleave(runs, repeats, warmup=0).items()}
    table = Table(f"fp8 vs bf16 training step, {depth} MLP blocks of width {width}, batch {batch}",
                  ["side", "bf16 step", "fp8 step", "fp8 / bf16", "fp8 vs raw torchao"])
    for side in sides:
        bf16, fp8 = samples[f"{side}|bf16"], samples[f"{side}|fp8"]
        table.rows.append([side, fmt_time(bf16), fmt_time(fp8), ratio(fp8, bf16), ratio(fp8, samples[f"{RAW_AO}|fp8"])])
    import torch

    table.notes.append(f"{torch.cuda.get_device_name()}; median of {repeats} runs of {steps} steps per cell, cells "
                       "interleaved; AdamW; first and last Linear layers in bf16.")
    if ACCELERATE in sides:
        table.notes.append("Accelerate's default AORecipeKwargs leaves the converted weights out of the optimizer "
                           "outside FSDP2 (docs/differences.md), so its fp8 optimizer step does less work.")
    else:
        table.notes.append(ACCELERATE_LEFT_OUT)
    return [table]


def build_parser():
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8192, help="rows per step (tokens)")
    parser.add_argument("--steps", type=int, default=20)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    reason = cannot_run()
    if reason is not None:
        print(f"fp8_vs_bf16: needs a CUDA GPU with compute capability >= 8.9 and torchao; {reason}", file=sys.stderr)
        return 2
    return print_tables(run(args))


if __name__ == "__main__":
    sys.exit(main())
