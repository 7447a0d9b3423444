"""What the per-step breakdown (`accelerator.track_step_times`) costs: one epoch of a tiny MLP read through a
prepared data loader, with the breakdown off and on, beside the same loop in raw PyTorch, in one process.

The tiny model makes the framework's cost dominate, so this is the worst case for the breakdown's clock reads.
Accelerate has no per-step breakdown, so it has no column here. Run: `python -m benchmarks.step_breakdown [--quick]`.
"""

from __future__ import annotations

import gc
import os
import sys

if __package__ in (None, ""):  # run as `python benchmarks/step_breakdown.py`: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
from torch.utils.data import DataLoader, TensorDataset

from benchmarks._common import (
    CLOCKS, HASTEN, RAW, Table, add_clock_option, base_parser, fmt_time, interleave, median, print_tables, ratio,
    spread,
)

WITH_BREAKDOWN = "hasten + breakdown"


def _parts(batches: int):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(16 * batches, 32, generator=g), torch.randn(16 * batches, 32, generator=g))
    return model, optimizer, DataLoader(data, batch_size=16)


def raw_side(batches: int):
    model, optimizer, loader = _parts(batches)

    def run():
        for x, y in loader:
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    return run


def hasten_side(batches: int, breakdown: bool):
    from hasten import Accelerator

    accelerator = Accelerator(cpu=True)
    model, optimizer, loader = accelerator.prepare(*_parts(batches))
    if breakdown:
        accelerator.track_step_times(log_every=50)  # no trackers started: log() is called and keeps nothing

    def run():
        for x, y in loader:
            accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
            optimizer.step()
            optimizer.zero_grad()

    return run


def _timed(run, clock):
    def measure():
        start = clock()
        run()
        return clock() - start

    return measure


def run(args) -> list[Table]:
    torch.set_num_threads(1)
    batches = 32 if args.quick else 400
    repeats = args.repeats or (3 if args.quick else 15)
    sides = {RAW: raw_side(batches), HASTEN: hasten_side(batches, False),
             WITH_BREAKDOWN: hasten_side(batches, True)}
    gc.collect()
    gc.freeze()
    samples = interleave({name: _timed(fn, CLOCKS[args.clock]) for name, fn in sides.items()}, repeats, warmup=2)
    per_step = {name: median(values) / batches for name, values in samples.items()}
    table = Table("Step breakdown overhead (time per step, median)",
                  [RAW, HASTEN, WITH_BREAKDOWN, "breakdown on / off", "on - off per step"])
    table.rows.append([*(_cell(per_step[name], samples[name]) for name in sides),
                       ratio(per_step[WITH_BREAKDOWN], per_step[HASTEN]),
                       fmt_time(per_step[WITH_BREAKDOWN] - per_step[HASTEN])])
    table.notes.append(f"{repeats} timed epochs of {batches} steps per side after 2 warm-up rounds, sides "
                       f"interleaved; tiny MLP, batch 16, AdamW, prepared DataLoader; clock: {args.clock}; "
                       "± is half the interquartile range.")
    table.notes.append("Off, the breakdown installs nothing; on, it reads the clock around each fetch, backward "
                       "and optimizer step (log_every=50).")
    return [table]


def _cell(value: float, samples) -> str:
    rel = spread(samples)
    return fmt_time(value) + ("" if rel != rel else f" ±{rel * 100:.0f}%")


def build_parser():
    parser = base_parser(__doc__.splitlines()[0])
    add_clock_option(parser)
    return parser


def main(argv=None) -> int:
    return print_tables(run(build_parser().parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
