"""What debug mode costs per training step, 2 CPU processes (gloo): hasten's hang doctor vs Accelerate's debug mode.

Each launch trains a tiny MLP under DDP for a fixed number of steps and, every step, makes one collective the
way a training loop logs its loss:

- `user all_reduce`: the user's own `torch.distributed.all_reduce(loss)`. Under the doctor this is one
  `compare_set` on the job's store before the collective; Accelerate's debug mode does not see it.
- `reduce`: `accelerator.reduce(loss)`. In debug mode both libraries also compare the shapes of every rank
  first (an `all_gather_object`, so that every rank raises the same catchable error on a mismatch); hasten's
  doctor adds its `compare_set` on top.

The processes time themselves between two barriers after warm-up steps (start-up excluded); launches of the
sides alternate. Run: `python -m benchmarks.hang_doctor [--quick]`. This file is also the training script the
launchers start (`--worker ...`).
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
    ACCELERATE,
    ACCELERATE_LEFT_OUT,
    HASTEN,
    Table,
    base_parser,
    clean_env,
    console_script,
    fmt_time,
    free_port,
    median,
    print_tables,
    want_accelerate,
)

RESULT_TAG = "BENCH_RESULT "
ROWS = ("step + user all_reduce", "step + accelerator.reduce", "one all_reduce alone")


def worker(impl: str, steps: int, warmup: int) -> None:
    import torch
    import torch.distributed as dist

    if impl == HASTEN:
        from hasten import Accelerator
    else:
        from accelerate import Accelerator
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    accelerator = Accelerator(cpu=True)
    model, optimizer = accelerator.prepare(model, optimizer)
    rank = dist.get_rank()
    g = torch.Generator().manual_seed(rank)
    batches = [(torch.randn(4, 16, generator=g), torch.randn(4, 1, generator=g)) for _ in range(8)]

    def step(index, collective):
        x, y = batches[index % len(batches)]
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        logged = loss.detach().reshape(1)
        if collective == "reduce":
            accelerator.reduce(logged, "mean")
        else:
            dist.all_reduce(logged)

    one = torch.ones(1)
    loops = {
        ROWS[0]: lambda i: step(i, "all_reduce"),
        ROWS[1]: lambda i: step(i, "reduce"),
        ROWS[2]: lambda i: dist.all_reduce(one),
    }
    result = {}
    for name, body in loops.items():
        for index in range(warmup):
            body(index)
        dist.barrier()
        start = time.perf_counter()
        for index in range(steps):
            body(index)
        dist.barrier()
        result[name] = (time.perf_counter() - start) / steps
    if rank == 0:
        print(RESULT_TAG + json.dumps(result), flush=True)


def _launch(impl: str, debug: bool, steps: int, warmup: int) -> dict:
    # One thread per process on both sides, as in ddp_throughput.
    env = clean_env(OMP_NUM_THREADS="1")
    script = os.path.abspath(__file__)
    worker_args = ["--worker", impl, str(steps), str(warmup)]
    flags = ["--debug"] if debug else []
    if impl == HASTEN:
        command = [sys.executable, "-m", "hasten", "launch", "--num_processes", "2", "--cpu", *flags]
    else:
        # `accelerate launch --cpu` starts one process; `--multi_gpu` goes through torchrun, ACCELERATE_USE_CPU
        # keeps it on the CPU with gloo (see ddp_throughput).
        env["ACCELERATE_USE_CPU"] = "true"
        command = [*console_script("accelerate"), "launch", "--multi_gpu", "--num_processes", "2",
                   "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                   "--main_process_port", str(free_port()), *flags]
    out = subprocess.run([*command, script, *worker_args], env=env, capture_output=True, text=True, timeout=900)
    for line in out.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG):])
    raise RuntimeError(f"{' '.join(command)} printed no result:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")


def build_parser():
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None, help="timed steps per launch")
    return parser


def run(args) -> list[Table]:
    steps = args.steps or (30 if args.quick else 500)
    warmup = 5 if args.quick else 50
    repeats = args.repeats or (1 if args.quick else 3)
    sides = [(HASTEN, False), (HASTEN, True)]
    if want_accelerate(args):
        sides += [(ACCELERATE, False), (ACCELERATE, True)]
    samples = {side: [] for side in sides}
    for round_index in range(repeats):  # launches alternate between the sides
        shift = round_index % len(sides)
        for side in sides[shift:] + sides[:shift]:
            samples[side].append(_launch(side[0], side[1], steps, warmup))
    names = [f"{impl} {'debug' if debug else 'off'}" for impl, debug in sides]
    table = Table("Debug mode per step and per collective (2 processes, gloo, tiny MLP under DDP)",
                  ["loop", *names, "hasten debug - off", "accelerate debug - off"])
    for row in ROWS:
        medians = {side: median([sample[row] for sample in samples[side]]) for side in sides}

        def added(impl):
            off, on = medians.get((impl, False)), medians.get((impl, True))
            if off is None or on is None:
                return "—"
            return f"{(on - off) * 1e6:+.0f} µs ({(on / off - 1) * 100:+.1f}%)"

        table.rows.append([row, *(fmt_time(medians[side]) for side in sides), added(HASTEN), added(ACCELERATE)])
    table.notes.append(f"median of {repeats} launch(es) per side, {steps} timed iterations per loop after {warmup} "
                       "warm-up ones; on a shared machine the spread between launches is several percent")
    table.notes.append("hasten debug: the hang doctor's one store `compare_set` per collective (plus, for "
                       "`reduce`, the shape check: one all_gather of a checksum); Accelerate's debug mode checks "
                       "`reduce` with a `gather_object` and does not see the user's own `all_reduce`")
    if not want_accelerate(args):
        table.notes.append(ACCELERATE_LEFT_OUT)
    return [table]


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        worker(argv[1], int(argv[2]), int(argv[3]))
        return 0
    return print_tables(run(build_parser().parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
