"""Per-batch overhead of a prepared data loader vs the raw `DataLoader`, single process.

The dataset is a `TensorDataset` with small batches, so what is timed is the loader machinery itself:
the raw loader, the loader returned by hasten's `Accelerator.prepare`, and Accelerate's. Epochs of the
three alternate (ABCABC...). Run: `python -m benchmarks.data_loader [--quick]`.
"""

from __future__ import annotations

import gc
import os
import sys

if __package__ in (None, ""):  # run as `python benchmarks/data_loader.py`: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
from torch.utils.data import DataLoader, TensorDataset

from benchmarks._common import (
    print_tables,
    ACCELERATE,
    ACCELERATE_LEFT_OUT,
    CLOCKS,
    HASTEN,
    RAW,
    Table,
    add_clock_option,
    base_parser,
    fmt_time,
    hasten_module_available,
    interleave,
    median,
    ratio,
    spread,
    want_accelerate,
)


def _dataset(samples: int) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(samples, 16, generator=g), torch.randn(samples, 1, generator=g))


def _prepared(library: str, loader: DataLoader) -> DataLoader:
    if library == HASTEN:
        from hasten import Accelerator
        from hasten.state import AcceleratorState, GradientState
    else:
        from accelerate import Accelerator
        from accelerate.state import AcceleratorState, GradientState
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    return Accelerator(cpu=True).prepare(loader)


def _epoch(loader, clock):
    def measure():
        start = clock()
        count = 0
        for _batch in loader:
            count += 1
        return (clock() - start) / count

    return measure


def run(args) -> list[Table]:
    torch.set_num_threads(1)
    clock = CLOCKS[args.clock]
    samples = 512 if args.quick else 16384
    batch_size = 8
    repeats = args.repeats or (3 if args.quick else 15)
    with_hasten = hasten_module_available("data_loader")
    with_accelerate = want_accelerate(args)
    columns = ["loader", RAW, HASTEN] + ([ACCELERATE] if with_accelerate else []) + ["hasten / raw"]
    if with_accelerate:
        columns += ["accelerate / raw"]
    table = Table("Data loader overhead (time per batch, median)", columns)
    dataset = _dataset(samples)
    for shuffle in (False, True):
        def loader():
            return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle)

        sides = {RAW: _epoch(loader(), clock)}
        if with_accelerate:
            sides[ACCELERATE] = _epoch(_prepared(ACCELERATE, loader()), clock)
        if with_hasten:
            sides[HASTEN] = _epoch(_prepared(HASTEN, loader()), clock)
        gc.collect()
        gc.freeze()
        samples_by_side = interleave(sides, repeats, warmup=1)
        per_batch = {name: median(values) for name, values in samples_by_side.items()}
        row = ["shuffled" if shuffle else "sequential", _cell(samples_by_side[RAW])]
        row.append(_cell(samples_by_side[HASTEN]) if with_hasten else "skipped")
        if with_accelerate:
            row.append(_cell(samples_by_side[ACCELERATE]))
        row.append(ratio(per_batch[HASTEN], per_batch[RAW]) if with_hasten else "—")
        if with_accelerate:
            row.append(ratio(per_batch[ACCELERATE], per_batch[RAW]))
        table.rows.append(row)
    table.notes.append(
        f"TensorDataset of {samples} samples (16 features), batch size {batch_size}, num_workers=0; one repetition "
        f"is one epoch; {repeats} epochs per side after 1 warm-up, interleaved; clock: {args.clock}. "
        "Target: hasten / raw ≤ 1.05."
    )
    if not with_hasten:
        table.notes.append("hasten skipped: this checkout has no `hasten.data_loader` yet.")
    if not with_accelerate:
        table.notes.append(ACCELERATE_LEFT_OUT)
    return [table]


def _cell(values) -> str:
    rel = spread(values)
    return fmt_time(median(values)) + ("" if rel != rel else f" ±{rel * 100:.0f}%")


def build_parser():
    parser = base_parser(__doc__.splitlines()[0])
    add_clock_option(parser)
    return parser


def main(argv=None) -> int:
    return print_tables(run(build_parser().parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
