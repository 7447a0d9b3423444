"""What debug mode costs per training step, 2 CPU processes (gloo): hasten's hang doctor vs Accelerate's debug mode.

One launch per library, both under `--debug`; inside it the processes switch debug mode on and off in
lockstep between blocks of iterations (on/off/off/on/...), so that both modes see the same machine load: on a
shared machine the spread between two launches is larger than the effect. "off" for hasten is the doctor's
wrappers left installed but idle (a dictionary lookup more than with debug mode off from the start).

Loops timed (a tiny MLP under DDP, and the collective a training loop makes to log its loss):

- `step + user all_reduce`: the user's own `torch.distributed.all_reduce(loss)`. Under the doctor the main
  thread numbers the collective and queues its fingerprint (a few µs); the doctor's checker thread compares the
  ranks' fingerprints through the job's store in batches (one store request per rank every 50 ms), off the
  main thread. Accelerate's debug mode does not see this collective.
- `step + accelerator.reduce`: in debug mode both libraries also compare every rank's shapes first (hasten:
  one all_gather of a checksum; Accelerate: a `gather_object`), a collective more per step; hasten's doctor
  adds its queued fingerprint.
- `one all_reduce alone`: the cost per collective, without a step around it.

On a loaded machine the spread of one block is larger than the doctor's cost: run it more than once (and
with `--rounds 60`) before reading a difference of a few tens of µs.

Run: `python -m benchmarks.hang_doctor [--quick]`. This file is also the training script the launchers start
(`--worker ...`).
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


def worker(impl: str, block: int, rounds: int, warmup: int) -> None:
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
    if impl == HASTEN:
        from hasten.resilience import hang_doctor
        from hasten.state import PartialState

        doctor = hang_doctor._DOCTOR
        assert doctor is not None, "launched without --debug"

        def set_debug(on):
            hang_doctor._DOCTOR = doctor if on else None
            PartialState().debug = on
    else:
        from accelerate.state import PartialState

        def set_debug(on):
            PartialState().debug = on

    result = {}
    for name, body in loops.items():
        for index in range(warmup):
            body(index)
        times = {True: [], False: []}
        for round_index in range(rounds):
            for on in ((True, False) if round_index % 2 == 0 else (False, True)):
                set_debug(on)
                dist.barrier()
                start = time.perf_counter()
                for index in range(block):
                    body(index)
                dist.barrier()
                times[on].append((time.perf_counter() - start) / block)
        set_debug(True)
        result[name] = times
    if rank == 0:
        print(RESULT_TAG + json.dumps(result), flush=True)


def _launch(impl: str, block: int, rounds: int, warmup: int) -> dict:
    # One thread per process on both sides, as in ddp_throughput.
    env = clean_env(OMP_NUM_THREADS="1")
    script = os.path.abspath(__file__)
    worker_args = ["--worker", impl, str(block), str(rounds), str(warmup)]
    flags = ["--debug"]
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
    parser.add_argument("--block", type=int, default=None, help="iterations per block (one mode)")
    parser.add_argument("--rounds", type=int, default=None, help="blocks per mode")
    return parser


def run(args) -> list[Table]:
    block = args.block or (10 if args.quick else 50)
    rounds = args.rounds or (4 if args.quick else 30)
    warmup = 5 if args.quick else 50
    impls = [HASTEN] + ([ACCELERATE] if want_accelerate(args) else [])
    results = {impl: _launch(impl, block, rounds, warmup) for impl in impls}
    columns = ["loop"]
    for impl in impls:
        columns += [f"{impl} off", f"{impl} debug", f"{impl} debug - off"]
    table = Table("Debug mode per step and per collective (2 processes, gloo, tiny MLP under DDP)", columns)
    for row in ROWS:
        cells = [row]
        for impl in impls:
            times = results[impl][row]
            off, on = median(times["false"]), median(times["true"])
            # paired: each "on" block against the "off" block of the same round
            added = median([b - a for a, b in zip(times["false"], times["true"])])
            cells += [fmt_time(off), fmt_time(on), f"{added * 1e6:+.0f} µs ({added / off * 100:+.1f}%)"]
        table.rows.append(cells)
    table.notes.append(f"{rounds} blocks of {block} iterations per mode, alternating within one launch per library "
                       f"(after {warmup} warm-up iterations); medians of the per-iteration times, and the median "
                       "of the paired block differences")
    if not want_accelerate(args):
        table.notes.append(ACCELERATE_LEFT_OUT)
    return [table]


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        worker(argv[1], int(argv[2]), int(argv[3]), int(argv[4]))
        return 0
    return print_tables(run(build_parser().parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
