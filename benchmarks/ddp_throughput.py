"""DDP training throughput on 2 CPU processes: `hasten launch` vs raw DDP under torchrun vs `accelerate launch`.

Each launch trains an MLP for a fixed number of steps on pre-built batches (no data loading timed). The
processes time themselves between two barriers, after warm-up steps, so start-up is excluded; rank 0 prints
steps/s and the largest peak RSS over the ranks. Launches of the three sides alternate (ABCABC...).

Run: `python -m benchmarks.ddp_throughput [--quick]`. This file is also the training script the launchers
start (`--worker raw|hasten|accelerate`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

if __package__ in (None, ""):  # run as a script (by the launchers): make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks._common import (
    print_tables,
    ACCELERATE,
    ACCELERATE_LEFT_OUT,
    HASTEN,
    RAW,
    Table,
    base_parser,
    clean_env,
    console_script,
    fmt_mb,
    free_port,
    median,
    peak_rss_bytes,
    ratio,
    want_accelerate,
)

RESULT_TAG = "BENCH_RESULT "
NUM_PROCESSES = 2


# -- the training script, run in each launched process ----------------------------------------------------------
def _model(width: int, depth: int):
    import torch

    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, 1))


def worker(impl: str, steps: int, warmup: int, width: int, depth: int, batch: int) -> None:
    import torch
    import torch.distributed as dist

    torch.manual_seed(0)
    model = _model(width, depth)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    if impl == RAW:
        from torch.nn.parallel import DistributedDataParallel

        dist.init_process_group("gloo")
        model = DistributedDataParallel(model)
        accelerator = None
    else:
        if impl == HASTEN:
            from hasten import Accelerator
        else:
            from accelerate import Accelerator
        accelerator = Accelerator(cpu=True)
        model, optimizer = accelerator.prepare(model, optimizer)
        assert dist.is_initialized() and dist.get_world_size() == NUM_PROCESSES, f"{impl} did not start DDP"
    rank = dist.get_rank()
    g = torch.Generator().manual_seed(rank)
    batches = [(torch.randn(batch, width, generator=g), torch.randn(batch, 1, generator=g)) for _ in range(8)]
    loss_fn = torch.nn.functional.mse_loss

    def train(count):
        for i in range(count):
            x, y = batches[i % len(batches)]
            loss = loss_fn(model(x), y)
            if accelerator is None:
                loss.backward()
            else:
                accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()

    train(warmup)
    dist.barrier()
    start = time.perf_counter()
    train(steps)
    dist.barrier()
    elapsed = time.perf_counter() - start

    rss = torch.tensor([peak_rss_bytes()], dtype=torch.float64)
    dist.all_reduce(rss, op=dist.ReduceOp.MAX)
    if rank == 0:
        result = {"steps_per_s": steps / elapsed, "max_rss": rss.item(), "threads": torch.get_num_threads()}
        print(RESULT_TAG + json.dumps(result), flush=True)
    dist.barrier()
    # Leave without tearing down: with torch 2.13, freeing a DDP model after its gloo group can deadlock
    # (the group's destructor joins a worker thread that waits for the GIL the destructor holds).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# -- the driver -------------------------------------------------------------------------------------------------
def launch_command(side: str, script_args: list[str]) -> list[str]:
    script = os.path.abspath(__file__)
    n = str(NUM_PROCESSES)
    if side == RAW:
        return [*console_script("torchrun"), "--standalone", "--nproc_per_node", n, script, *script_args]
    if side == HASTEN:
        return [*console_script("hasten"), "launch", "--cpu", "--num_processes", n, script, *script_args]
    # `accelerate launch --cpu` starts one process (several need mpirun); `--multi_gpu` goes through torchrun,
    # and ACCELERATE_USE_CPU keeps it on the CPU with gloo. The port is free-picked: 29500 may be taken.
    return [*console_script("accelerate"), "launch", "--multi_gpu", "--num_processes", n, "--num_machines", "1",
            "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()),
            script, *script_args]


def run_launch(side: str, script_args: list[str], timeout: float = 600) -> dict:
    """One launch; returns the rank-0 result dict, or raises with the launch's output on failure."""
    impl = {RAW: RAW, HASTEN: HASTEN, ACCELERATE: ACCELERATE}[side]
    command = launch_command(side, ["--worker", impl, *script_args])
    # One thread per process on every side (torchrun would pick 1, hasten cores/2): same work for each.
    env = clean_env(OMP_NUM_THREADS="1")
    if side == ACCELERATE:
        env["ACCELERATE_USE_CPU"] = "true"
    out = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout)
    for line in out.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG):])
    raise RuntimeError(
        f"{side}: `{' '.join(command)}` exited {out.returncode} without a result\n"
        f"--- stdout\n{out.stdout[-3000:]}\n--- stderr\n{out.stderr[-3000:]}"
    )


def run(args) -> list[Table]:
    quick = args.quick
    repeats = args.repeats or (1 if quick else 5)
    steps = args.steps or (10 if quick else 300)
    width = 64 if quick else 512
    depth = 2 if quick else 4
    script_args = ["--steps", str(steps), "--warmup", "3" if quick else "20", "--width", str(width),
                   "--depth", str(depth), "--batch", "32"]
    sides = [RAW, HASTEN] + ([ACCELERATE] if want_accelerate(args) else [])
    results: dict[str, list[dict]] = {side: [] for side in sides}
    for round_index in range(repeats):
        shift = round_index % len(sides)
        for side in sides[shift:] + sides[:shift]:
            results[side].append(run_launch(side, script_args))
    rate = {side: median([r["steps_per_s"] for r in results[side]]) for side in sides}
    rss = {side: max(r["max_rss"] for r in results[side]) for side in sides}
    params = sum(p.numel() for p in _model(width, depth).parameters())
    table = Table(f"DDP throughput, {NUM_PROCESSES} CPU processes (gloo)",
                  ["side", "steps/s (median)", "min – max", "vs raw", "peak RSS per process", "torch threads"])
    for side in sides:
        rates = [r["steps_per_s"] for r in results[side]]
        table.rows.append([side, f"{rate[side]:.1f}", f"{min(rates):.1f} – {max(rates):.1f}",
                           ratio(rate[side], rate[RAW]), fmt_mb(rss[side]),
                           ", ".join(sorted({str(r["threads"]) for r in results[side]}))])
    table.notes.append(
        f"MLP {depth}x{width} ({params / 1e6:.2f} M parameters), batch 32 per process, AdamW, fp32, "
        f"OMP_NUM_THREADS=1; {steps} timed steps after warm-up, {repeats} launches per side, interleaved."
    )
    table.notes.append(
        "Launchers: `torchrun --standalone`, `hasten launch --cpu`, `accelerate launch --multi_gpu` with "
        "ACCELERATE_USE_CPU=true (its `--cpu` starts a single process without mpirun). Target: hasten ≥ 0.99 × raw."
    )
    if ACCELERATE not in sides:
        table.notes.append(ACCELERATE_LEFT_OUT)
    return [table]


def build_parser():
    import argparse

    hidden = argparse.SUPPRESS
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None, help="timed steps per launch")
    # Used by the launched processes only.
    parser.add_argument("--worker", choices=[RAW, HASTEN, ACCELERATE], default=None, help=hidden)
    parser.add_argument("--warmup", type=int, default=20, help=hidden)
    parser.add_argument("--width", type=int, default=512, help=hidden)
    parser.add_argument("--depth", type=int, default=4, help=hidden)
    parser.add_argument("--batch", type=int, default=32, help=hidden)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.worker:
        worker(args.worker, args.steps or 100, args.warmup, args.width, args.depth, args.batch)
        return 0
    return print_tables(run(args))


if __name__ == "__main__":
    sys.exit(main())
