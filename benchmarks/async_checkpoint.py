"""What `save_state` costs a training loop: hasten's asynchronous save vs its synchronous save, raw `torch.save`
and Accelerate's `save_state` (synchronous), on 1 and 2 CPU processes.

Each process holds the same model (DDP: every rank keeps the whole model) with its AdamW state, so a checkpoint
is ~3x the weights, written by rank 0. Every round is a save followed by the real next training step through
hasten's prepared model and optimizer: one forward+backward on a batch sized so that it takes longer than
copying the checkpoint's tensors (both printed), then `optimizer.step()`. Per side, of the slowest rank:
(a) *blocks training*: time in the save call plus the time that step waited for the asynchronous save's
staging copy (hasten's own counter, `async_checkpoint.waited_for_staging`); (b) *slows the step*: the
iteration's time (call + forward/backward + step) minus that of an iteration without a save, which also
counts the background thread's CPU contention. For the asynchronous save the table also gives the time
until the checkpoint is committed and the first asynchronous save (which allocates the staging buffers).
Synchronous hasten and raw torch are timed until their files are durable (fsync); Accelerate's `save_state`
does not fsync and is timed as it blocks a training loop. Sides alternate (ABCABC...); medians. Every round
deletes its checkpoint. Target (issue 17): (a) of the asynchronous save ≤ 0.05 × the synchronous save.
Run: `python -m benchmarks.async_checkpoint [--quick] [--size-mb 256] [--repeats 3] [--processes 1,2]`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

if __package__ in (None, ""):  # run as a script (also by the launcher): make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks._common import (
    ACCELERATE,
    ACCELERATE_LEFT_OUT,
    RAW,
    Table,
    base_parser,
    clean_env,
    console_script,
    fmt_time,
    median,
    print_tables,
    ratio,
    want_accelerate,
)

RESULT_TAG = "BENCH_RESULT "
HASTEN_ASYNC = "hasten async_save=True"
HASTEN_SYNC = "hasten (synchronous)"
NO_SAVE = "no save"


# -- the launched worker ----------------------------------------------------------------------------------------
def _model(size_mb: int):
    import torch

    width = 2048 if size_mb >= 64 else 256
    layers = max(1, round(size_mb * 2**20 / (width * width * 4)))
    return torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layers)])


def _fsync_tree(folder: str) -> None:
    for root, _, names in os.walk(folder):
        for name in names:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def _batch_longer_than_copy(model, optimizer, forward_backward, width: int, copy_seconds: float) -> tuple:
    """The smallest batch of the form 8·2^k whose forward+backward takes longer than 1.5 × `copy_seconds`."""
    import torch

    batch = 8
    while True:
        x = torch.randn(batch, width)
        forward_backward(x)  # warm
        start = time.perf_counter()
        forward_backward(x)
        seconds = time.perf_counter() - start
        optimizer.zero_grad(set_to_none=True)
        if seconds > 1.5 * copy_seconds or batch >= 4096:
            return batch, seconds
        batch *= 2


def _copy_seconds(model, optimizer) -> float:
    """Time to copy every parameter and optimizer state tensor into buffers already touched (what staging does)."""
    import torch

    sources = list(model.parameters()) + [t for s in optimizer.state.values() for t in s.values()
                                          if isinstance(t, torch.Tensor)]
    buffers = [torch.empty_like(t, device="cpu") for t in sources]
    for _ in range(2):
        start = time.perf_counter()
        for buffer, source in zip(buffers, sources):
            buffer.copy_(source.detach())
        seconds = time.perf_counter() - start
    return seconds


def worker(size_mb: int, repeats: int, with_accelerate: bool, workdir: str) -> None:
    import torch
    import torch.distributed as dist

    from hasten import Accelerator
    from hasten.checkpoint import async_save as background

    torch.manual_seed(0)
    model = _model(size_mb)
    width = model[0].in_features
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for p in model.parameters():  # AdamW's two moment buffers exist (and are incompressible) after one step
        p.grad = torch.randn_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)

    hasten = Accelerator(cpu=True)
    h_model, h_optimizer = hasten.prepare(model, optimizer)
    rank, world = hasten.process_index, hasten.num_processes

    def barrier():
        if world > 1:
            dist.barrier()

    def slowest(values: dict) -> dict:
        if world == 1:
            return values
        tensor = torch.tensor(list(values.values()), dtype=torch.float64)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return dict(zip(values, tensor.tolist()))

    def forward_backward(x):
        hasten.backward(h_model(x).pow(2).mean())

    copy_seconds = slowest({"copy": _copy_seconds(model, optimizer)})["copy"]
    batch, fb_seconds = _batch_longer_than_copy(model, h_optimizer, forward_backward, width, copy_seconds)
    batch = int(slowest({"batch": batch})["batch"])  # the same batch on every rank
    x = torch.randn(batch, width)

    def round_with(save=None, finish=None) -> dict:
        """A save (or none), then the next training step; times as documented at the top."""
        folder = os.path.join(workdir, "ckpt")
        barrier()
        waited_before = background.waited_for_staging[0]
        start = time.perf_counter()
        if save is not None:
            save(folder)
        called = time.perf_counter() - start
        forward_backward(x)
        h_optimizer.step()
        iteration = time.perf_counter() - start
        h_optimizer.zero_grad(set_to_none=True)
        waited = background.waited_for_staging[0] - waited_before
        if finish is not None:
            finish()
        committed = time.perf_counter() - start
        result = slowest({"call": called, "waited": waited, "blocked": called + waited, "iteration": iteration,
                          "committed": committed})
        barrier()
        if rank == 0:
            shutil.rmtree(folder, ignore_errors=True)
        barrier()
        return result

    def raw_save(folder):
        if rank == 0:
            os.makedirs(folder, exist_ok=True)
            torch.save(model.state_dict(), os.path.join(folder, "model.bin"))
            torch.save(optimizer.state_dict(), os.path.join(folder, "optimizer.bin"))
            _fsync_tree(folder)
        barrier()

    sides = {
        NO_SAVE: lambda: round_with(),
        HASTEN_SYNC: lambda: round_with(lambda f: hasten.save_state(f)),
        HASTEN_ASYNC: lambda: round_with(lambda f: hasten.save_state(f, async_save=True), hasten.wait_for_checkpoint),
        RAW: lambda: round_with(raw_save),
    }
    if with_accelerate:
        from accelerate import Accelerator as AccelerateAccelerator

        for obj in (model, optimizer):  # hasten's mark would make Accelerate take them as prepared already
            obj.__dict__.pop("_is_accelerate_prepared", None)
        accelerate = AccelerateAccelerator(cpu=True)  # joins the process group hasten started
        accelerate.prepare(model, optimizer)
        sides[ACCELERATE] = lambda: round_with(lambda f: accelerate.save_state(f))

    round_with()  # warm the training step
    first_async = sides[HASTEN_ASYNC]()
    samples = {name: [] for name in sides}
    names = list(sides)
    for round_index in range(repeats):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            samples[name].append(sides[name]())
    if rank == 0:
        nbytes = 3 * sum(p.numel() * p.element_size() for p in model.parameters())
        print(RESULT_TAG + json.dumps({"samples": samples, "first_async": first_async, "bytes": nbytes,
                                       "batch": batch, "forward_backward": fb_seconds, "copy": copy_seconds}),
              flush=True)
    hasten.end_training()
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown of the process group (see benchmarks/ddp_throughput.py)


# -- the driver -------------------------------------------------------------------------------------------------
def run_launch(processes: int, size_mb: int, repeats: int, with_accelerate: bool, workdir: str) -> dict:
    command = [*console_script("hasten"), "launch", "--cpu", "--num_processes", str(processes),
               os.path.abspath(__file__), "--worker", "--size-mb", str(size_mb), "--repeats", str(repeats),
               "--dir", workdir] + ([] if with_accelerate else ["--no-accelerate"])
    out = subprocess.run(command, capture_output=True, text=True, env=clean_env(OMP_NUM_THREADS="1"), timeout=1800)
    for line in out.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG):])
    raise RuntimeError(f"`{' '.join(command)}` exited {out.returncode} without a result\n"
                       f"--- stdout\n{out.stdout[-3000:]}\n--- stderr\n{out.stderr[-3000:]}")


def run(args) -> list[Table]:
    size_mb = args.size_mb or (8 if args.quick else 256)
    repeats = args.repeats or (1 if args.quick else 3)
    counts = [int(n) for n in (args.processes or ("1" if args.quick else "1,2")).split(",")]
    with_accelerate = want_accelerate(args)
    base = args.dir or tempfile.gettempdir()
    tables = []
    for processes in counts:
        workdir = tempfile.mkdtemp(prefix="hasten-bench-async-", dir=base)
        try:
            result = run_launch(processes, size_mb, repeats, with_accelerate, workdir)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        samples = result["samples"]
        values = {name: {key: median([s[key] for s in runs]) for key in runs[0]} for name, runs in samples.items()}
        baseline = values.pop(NO_SAVE)["iteration"]
        sync = values[HASTEN_SYNC]["blocked"]
        table = Table(f"What save_state costs the next training step, {processes} process(es): checkpoint of "
                      f"{result['bytes'] / 2**20:.0f} MB (model + AdamW)",
                      ["side", "(a) blocks training", "(a) ÷ hasten synchronous", "(b) slows the step",
                       "(b) ÷ hasten synchronous", "until committed"])
        rows = [(name, values[name]) for name in values]
        first = result["first_async"]
        rows.append((f"{HASTEN_ASYNC}, first save (allocates staging buffers)", first))
        for name, v in rows:
            slowdown = v["iteration"] - baseline
            committed = v["committed"] if name.startswith(HASTEN_ASYNC) else v["blocked"]
            blocked = fmt_time(v["blocked"])
            if name.startswith(HASTEN_ASYNC):
                blocked += f" (call {fmt_time(v['call'])} + step waited {fmt_time(v['waited'])})"
            table.rows.append([name, blocked, ratio(v["blocked"], sync), fmt_time(slowdown), ratio(slowdown, sync),
                               fmt_time(committed)])
        table.notes.append(
            f"The step after each save: forward+backward on a batch of {result['batch']} "
            f"({fmt_time(result['forward_backward'])} alone, measured before the rounds) then optimizer.step(); an "
            f"iteration without a save took {fmt_time(baseline)}. Copying the checkpoint's parameters and optimizer "
            f"state into touched buffers took {fmt_time(result['copy'])}.")
        table.notes.append(
            f"{repeats} rounds per side, interleaved, medians of the slowest rank. (a) = time in the save call + "
            "time the next optimizer.step() waited for the asynchronous save's staging copy; (b) = the iteration's "
            "time minus an iteration without a save (includes the writer thread's CPU contention). Synchronous "
            "hasten and raw torch are timed until fsynced; Accelerate's save_state does not fsync. "
            f"Folder on the disk of {base}. Target: (a) of async ≤ 0.05 × synchronous.")
        if not with_accelerate:
            table.notes.append(ACCELERATE_LEFT_OUT)
        tables.append(table)
    return tables


def build_parser():
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=None, help="model weights in MB (default 256; 8 with --quick)")
    parser.add_argument("--processes", default=None, help="comma-separated process counts (default 1,2; 1 with --quick)")
    parser.add_argument("--dir", default=None, help="folder on the disk to write to (default: the temp dir)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # run by the launcher
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.worker:
        worker(args.size_mb, args.repeats, not args.no_accelerate, args.dir)
        return 0
    return print_tables(run(args))


if __name__ == "__main__":
    sys.exit(main())
