"""Per-step overhead of the training loop: hasten vs raw PyTorch vs Accelerate, in one process.

Each side trains its own copy of the same model on the same pre-built batches (already on the device, so
no data loading is timed) with the same optimizer, scheduler, autocast and loss scaling:

- raw torch:   autocast around forward, loss / GA, backward, step + scheduler + zero_grad every GA steps
- hasten:      Accelerator + prepare, then accumulate / backward / step / scheduler.step / zero_grad
- accelerate:  the same loop with `accelerate` names (Accelerator(cpu=True) on a CPU-only machine)

A tiny MLP shows the per-step overhead of the wrapper (framework cost dominates); a small transformer shows
it where compute dominates. Run: `python -m benchmarks.step_overhead [--quick]`.
"""

from __future__ import annotations

import gc
import os
import sys

if __package__ in (None, ""):  # run as `python benchmarks/step_overhead.py`: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

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
    interleave,
    median,
    ratio,
    spread,
    want_accelerate,
)

PRECISIONS = ("no", "bf16")
ACCUMULATION = (1, 4)


def make_mlp(quick: bool):
    width = 64
    model = torch.nn.Sequential(torch.nn.Linear(32, width), torch.nn.ReLU(), torch.nn.Linear(width, 32))
    return model, (16, 32), (16, 32)


def make_transformer(quick: bool):
    d_model, layers, seq, batch = (32, 1, 16, 4) if quick else (128, 2, 64, 8)
    layer = torch.nn.TransformerEncoderLayer(d_model, nhead=4, dim_feedforward=4 * d_model, batch_first=True,
                                             dropout=0.0)
    model = torch.nn.TransformerEncoder(layer, num_layers=layers, enable_nested_tensor=False)
    return model, (batch, seq, d_model), (batch, seq, d_model)


MODELS = {"tiny MLP": make_mlp, "small transformer": make_transformer}


def _batches(x_shape, y_shape, count):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(x_shape, generator=g), torch.randn(y_shape, generator=g)) for _ in range(count)]


def _fresh(make, quick):
    torch.manual_seed(0)
    model, x_shape, y_shape = make(quick)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    return model, optimizer, scheduler, x_shape, y_shape


def raw_side(make, quick, precision, ga, batches):
    model, optimizer, scheduler, _, _ = _fresh(make, quick)
    loss_fn = torch.nn.functional.mse_loss
    if precision == "bf16":
        def autocast():
            return torch.autocast("cpu", dtype=torch.bfloat16)
    else:
        import contextlib

        autocast = contextlib.nullcontext

    def run():
        model.train()
        for i, (x, y) in enumerate(batches):
            with autocast():
                out = model(x)
            loss = loss_fn(out.float(), y)
            if ga != 1:
                loss = loss / ga
            loss.backward()
            if (i + 1) % ga == 0:
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)

    return run


def _library_side(library, make, quick, precision, ga, batches):
    """The same loop for hasten and Accelerate; only the import differs."""
    if library == HASTEN:
        from hasten import Accelerator
        from hasten.state import AcceleratorState, GradientState
    else:
        from accelerate import Accelerator
        from accelerate.state import AcceleratorState, GradientState
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    accelerator = Accelerator(cpu=True, mixed_precision=precision, gradient_accumulation_steps=ga)
    model, optimizer, scheduler, _, _ = _fresh(make, quick)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    loss_fn = torch.nn.functional.mse_loss

    def run():
        model.train()
        for x, y in batches:
            with accelerator.accumulate(model):
                out = model(x)
                loss = loss_fn(out, y)
                accelerator.backward(loss)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()

    return run


def _timed(run, clock):
    def measure():
        start = clock()
        run()
        return clock() - start

    return measure


def run(args) -> list[Table]:
    quick = args.quick
    torch.set_num_threads(args.threads)
    repeats = args.repeats or (3 if quick else 15)
    with_accelerate = want_accelerate(args)
    columns = ["model", "precision", "GA", RAW, HASTEN]
    if with_accelerate:
        columns.append(ACCELERATE)
    columns += ["hasten / raw"]
    if with_accelerate:
        columns += ["accelerate / raw", "hasten / accelerate"]
    table = Table("Per-step overhead (time per micro-step, median)", columns)
    models = {name: make for name, make in MODELS.items() if args.model in (None, _key(name))}
    for model_name, make in models.items():
        steps = (16 if quick else 240) if model_name == "tiny MLP" else (8 if quick else 24)
        for precision in args.precision or PRECISIONS:
            for ga in args.ga or ACCUMULATION:
                _, _, _, x_shape, y_shape = _fresh(make, quick)
                batches = _batches(x_shape, y_shape, steps)
                # Build the Accelerate side before hasten's: each resets only its own library's state.
                sides = {RAW: raw_side(make, quick, precision, ga, batches)}
                if with_accelerate:
                    sides[ACCELERATE] = _library_side(ACCELERATE, make, quick, precision, ga, batches)
                sides[HASTEN] = _library_side(HASTEN, make, quick, precision, ga, batches)
                # Park everything built so far outside the collector's reach: collections during the timed
                # loops then cost what the loop itself allocates, not what importing torch left behind.
                gc.collect()
                gc.freeze()
                samples = interleave({name: _timed(fn, CLOCKS[args.clock]) for name, fn in sides.items()}, repeats, warmup=2)
                per_step = {name: median(values) / steps for name, values in samples.items()}
                row = [model_name, "fp32" if precision == "no" else precision, str(ga)]
                row += [_cell(per_step[RAW], samples[RAW]), _cell(per_step[HASTEN], samples[HASTEN])]
                if with_accelerate:
                    row.append(_cell(per_step[ACCELERATE], samples[ACCELERATE]))
                row.append(ratio(per_step[HASTEN], per_step[RAW]))
                if with_accelerate:
                    row += [ratio(per_step[ACCELERATE], per_step[RAW]), ratio(per_step[HASTEN], per_step[ACCELERATE])]
                table.rows.append(row)
                del sides, samples
    table.notes.append(
        f"{repeats} timed repetitions per side after 2 warm-up rounds, sides interleaved; one repetition is "
        f"{'16' if quick else '240'} micro-steps (MLP) or {'8' if quick else '24'} (transformer); ± is half the "
        "interquartile range."
    )
    table.notes.append(f"torch.set_num_threads({args.threads}); clock: {args.clock}.")
    table.notes.append("Targets: hasten / raw ≤ 1.02 on the tiny MLP; hasten / accelerate < 1.")
    if not with_accelerate:
        table.notes.append(ACCELERATE_LEFT_OUT)
    return [table]


def _cell(per_step: float, samples) -> str:
    rel = spread(samples)
    return fmt_time(per_step) + ("" if rel != rel else f" ±{rel * 100:.0f}%")


def _key(model_name: str) -> str:
    return model_name.split()[-1].lower()  # "tiny MLP" -> "mlp", "small transformer" -> "transformer"


def build_parser():
    parser = base_parser(__doc__.splitlines()[0])
    add_clock_option(parser)
    parser.add_argument("--model", choices=[_key(name) for name in MODELS], default=None,
                        help="measure one model only (default: both)")
    parser.add_argument("--precision", choices=PRECISIONS, action="append", default=None,
                        help="mixed precision to measure; repeat for several (default: no and bf16)")
    parser.add_argument("--ga", type=int, action="append", default=None,
                        help="gradient accumulation steps to measure; repeat for several (default: 1 and 4)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (default 1: steadier timings on a shared machine)")
    return parser


def main(argv=None) -> int:
    return print_tables(run(build_parser().parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
