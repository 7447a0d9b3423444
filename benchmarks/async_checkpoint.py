"""How long `save_state` blocks training: hasten's asynchronous save vs its synchronous save, raw `torch.save`
and Accelerate's `save_state` (synchronous), on 1 and 2 CPU processes.

Each process holds the same model (DDP: every rank keeps the whole model) with its AdamW state, so a checkpoint
is ~3x the weights, written by rank 0. A side's *blocking time* is how long the call keeps the slowest rank
from training (max over ranks, from a barrier before the call to the call's return). For the asynchronous
save the table also gives the time until the checkpoint is committed (the background write, nothing else
running) and the blocking time of the first asynchronous save, which allocates the staging buffers (later
saves copy into them). Synchronous hasten and raw torch are timed until their files are durable (fsync);
Accelerate's `save_state` does not fsync and is timed as it blocks a training loop. Sides alternate
(ABCABC...); medians. Every round deletes its checkpoint.
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
    HASTEN,
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


def worker(size_mb: int, repeats: int, with_accelerate: bool, workdir: str) -> None:
    import torch
    import torch.distributed as dist

    from hasten import Accelerator

    torch.manual_seed(0)
    model = _model(size_mb)
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

    def slowest(seconds: float) -> float:
        if world == 1:
            return seconds
        value = torch.tensor([seconds], dtype=torch.float64)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return value.item()

    def timed_save(save, finish=None) -> dict:
        folder = os.path.join(workdir, "ckpt")
        barrier()
        start = time.perf_counter()
        save(folder)
        blocked = time.perf_counter() - start
        if finish is not None:
            finish()
        done = time.perf_counter() - start
        result = {"blocked": slowest(blocked), "committed": slowest(done)}
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
        HASTEN_SYNC: lambda: timed_save(lambda f: hasten.save_state(f)),
        HASTEN_ASYNC: lambda: timed_save(lambda f: hasten.save_state(f, async_save=True), hasten.wait_for_checkpoint),
        RAW: lambda: timed_save(raw_save),
    }
    if with_accelerate:
        from accelerate import Accelerator as AccelerateAccelerator

        for obj in (model, optimizer):  # hasten's mark would make Accelerate take them as prepared already
            obj.__dict__.pop("_is_accelerate_prepared", None)
        accelerate = AccelerateAccelerator(cpu=True)  # joins the process group hasten started
        accelerate.prepare(model, optimizer)
        sides[ACCELERATE] = lambda: timed_save(lambda f: accelerate.save_state(f))

    first_async = timed_save(lambda f: hasten.save_state(f, async_save=True), hasten.wait_for_checkpoint)
    samples = {name: [] for name in sides}
    names = list(sides)
    for round_index in range(repeats):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            samples[name].append(sides[name]())
    if rank == 0:
        nbytes = 3 * sum(p.numel() * p.element_size() for p in model.parameters())
        print(RESULT_TAG + json.dumps({"samples": samples, "first_async": first_async, "bytes": nbytes}), flush=True)
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
        blocked = {name: median([s["blocked"] for s in runs]) for name, runs in samples.items()}
        sync = blocked[HASTEN_SYNC]
        table = Table(f"save_state blocking time, {processes} process(es): checkpoint of "
                      f"{result['bytes'] / 2**20:.0f} MB (model + AdamW)",
                      ["side", "blocks training", "÷ hasten synchronous", "until committed"])
        for name in samples:
            committed = median([s["committed"] for s in samples[name]]) if name == HASTEN_ASYNC else blocked[name]
            table.rows.append([name, fmt_time(blocked[name]), ratio(blocked[name], sync), fmt_time(committed)])
        first = result["first_async"]
        table.rows.append([f"{HASTEN_ASYNC}, first save (allocates staging buffers)", fmt_time(first["blocked"]),
                           ratio(first["blocked"], sync), fmt_time(first["committed"])])
        table.notes.append(
            f"{repeats} rounds per side, interleaved, medians of the slowest rank. Synchronous hasten and raw torch "
            "are timed until fsynced; Accelerate's save_state does not fsync. The asynchronous save's blocking "
            "time is staging a CPU copy of the model, optimizer and the rest; the write runs in the background. "
            f"Folder on the disk of {base}. Target: async blocks ≤ 0.05 × synchronous.")
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
