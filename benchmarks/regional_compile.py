"""Cold start of torch.compile: the whole model (raw torch) vs regional compilation (hasten's `compile_regions`
and Accelerate's) on a stack of identical transformer-like blocks.

Each sample starts from an empty dynamo cache and times the first forward + backward, which is where the
compiler runs; the steady-state step time is reported too. The default backend is `aot_eager` (traces
forward and backward like inductor, without generating C++), so the number is the tracing cost that
regional compilation divides by the depth. Run: `python -m benchmarks.regional_compile [--quick]`.
"""

from __future__ import annotations

import os
import sys
import time

if __package__ in (None, ""):  # run as `python benchmarks/regional_compile.py`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks._common import (
    ACCELERATE, ACCELERATE_LEFT_OUT, HASTEN, RAW, Table, base_parser, fmt_time, interleave, median, print_tables,
    ratio, want_accelerate,
)


def build_model(depth: int, width: int):
    import torch

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.LayerNorm(width)
            self.attn = torch.nn.MultiheadAttention(width, 4, batch_first=True)
            self.mlp = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                           torch.nn.Linear(4 * width, width))

        def forward(self, x):
            h = self.norm(x)
            x = x + self.attn(h, h, h, need_weights=False)[0]
            return x + self.mlp(x)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList(Block() for _ in range(depth))
            self.head = torch.nn.Linear(width, 1)

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return self.head(x).mean()

    return Net()


def measure(compile_fn, depth, width, backend, steps):
    """(first step seconds, median later step seconds) for a freshly compiled model."""
    import torch

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = compile_fn(build_model(depth, width), backend=backend)
    x = torch.randn(4, 16, width)
    start = time.perf_counter()
    model(x).backward()
    first = time.perf_counter() - start
    later = []
    for _ in range(steps):
        start = time.perf_counter()
        model(x).backward()
        later.append(time.perf_counter() - start)
    return first, median(later)


def run(args):
    import torch

    from hasten.utils import compile_regions

    depth, width = (4, 32) if args.quick else (args.depth, 64)
    repeats = args.repeats or (1 if args.quick else 3)
    sides = {RAW: torch.compile, HASTEN: compile_regions}
    if want_accelerate(args):
        from accelerate.utils import compile_regions as accelerate_compile_regions

        sides[ACCELERATE] = accelerate_compile_regions
    later_steps: dict = {name: [] for name in sides}

    def side(name, compile_fn):
        def once():  # interleave() collects the first-step time; the later-step time goes aside
            first_step, later_step = measure(compile_fn, depth, width, args.backend, 3)
            later_steps[name].append(later_step)
            return first_step
        return once

    samples = interleave({name: side(name, fn) for name, fn in sides.items()}, repeats, warmup=0)
    first = {name: median(values) for name, values in samples.items()}
    later = {name: median(values) for name, values in later_steps.items()}
    table = Table(f"torch.compile cold start, {depth} identical blocks (backend {args.backend})",
                  ["side", "first step (compile)", "vs whole model", "later step", "vs whole model"])
    labels = {RAW: "raw torch: torch.compile(model)", HASTEN: "hasten: compile_regions",
              ACCELERATE: "accelerate: compile_regions"}
    for name in sides:
        table.rows.append([labels[name], fmt_time(first[name]), ratio(first[name], first[RAW]),
                           fmt_time(later[name]), ratio(later[name], later[RAW])])
    table.notes.append(f"median of {repeats} cold starts per side, sides interleaved; later step = median of 3.")
    if ACCELERATE not in sides:
        table.notes.append(ACCELERATE_LEFT_OUT)
    return [table]


def build_parser():
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--depth", type=int, default=12, help="number of repeated blocks")
    parser.add_argument("--backend", default="aot_eager", help="dynamo backend (inductor needs a C++ compiler)")
    return parser


def main(argv=None) -> int:
    return print_tables(run(build_parser().parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
