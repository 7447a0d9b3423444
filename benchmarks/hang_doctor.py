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
    median,
    print_tables,
    want_accelerate,
)

RESULT_TAG = "BENCH_RESULT "
COLLECTIVES = ("user all_reduce", "reduce")


def worker(impl: str, collective: str, steps: int, warmup: int) -> None:
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

    def train(count):
        for step in range(count):
            x, y = batches[step % len(batches)]
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            logged = loss.detach().reshape(1)
            if collective == "reduce":
                accelerator.reduce(logged, "mean")
            else:
                dist.all_reduce(logged)

    train(warmup)
    dist.barrier()
    start = time.perf_counter()
    train(steps)
    dist.barrier()
    elapsed = time.perf_counter() - start
    if rank == 0:
        print(RESULT_TAG + json.dumps({"step": elapsed / steps}), flush=True)
    accelerator.end_training() if hasattr(accelerator, "end_training") else None


def _launch(impl: str, debug: bool, collective: str, steps: int, warmup: int) -> float:
    env = clean_env()
    script = os.path.abspath(__file__)
    worker_args = ["--worker", impl, collective, str(steps), str(warmup)]
    if impl == HASTEN:
        command = [sys.executable, "-m", "hasten", "launch", "--num_processes", "2", "--cpu"]
    else:
        command = [*console_script("accelerate"), "launch", "--num_processes", "2", "--cpu"]
    if debug:
        command.append("--debug")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.dirname(os.path.dirname(script)),
                                                    env.get("PYTHONPATH", "")) if p)
    out = subprocess.run([*command, script, *worker_args], env=env, capture_output=True, text=True, timeout=600)
    for line in out.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG):])["step"]
    raise RuntimeError(f"{' '.join(command)} printed no result:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")


def build_parser():
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None, help="timed steps per launch")
    return parser


def run(args) -> list[Table]:
    steps = args.steps or (30 if args.quick else 400)
    warmup = 5 if args.quick else 50
    repeats = args.repeats or (1 if args.quick else 3)
    sides = [(HASTEN, False), (HASTEN, True)]
    if want_accelerate(args):
        sides += [(ACCELERATE, False), (ACCELERATE, True)]
    names = {side: f"{side[0]} {'debug' if side[1] else 'off'}" for side in sides}
    table = Table("Debug mode per step (2 processes, gloo, tiny MLP + one logged-loss collective)",
                  ["collective", *names.values(), "hasten debug / off", "accelerate debug / off"])
    for collective in COLLECTIVES:
        samples = {side: [] for side in sides}
        for round_index in range(repeats):
            order = sides[round_index % len(sides):] + sides[:round_index % len(sides)]
            for side in order:
                samples[side].append(_launch(side[0], side[1], collective, steps, warmup))
        medians = {side: median(values) for side, values in samples.items()}

        def overhead(impl):
            off, on = medians.get((impl, False)), medians.get((impl, True))
            return "—" if off is None or on is None else f"{(on / off - 1) * 100:+.1f}%"

        table.rows.append([collective, *(fmt_time(medians[side]) for side in sides),
                           overhead(HASTEN), overhead(ACCELERATE)])
    table.notes.append(f"median of {repeats} launch(es) per side, {steps} timed steps each after {warmup} warm-up "
                       "steps; on a shared machine the spread between launches is several percent")
    if not want_accelerate(args):
        table.notes.append(ACCELERATE_LEFT_OUT)
    return [table]


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        impl, collective, steps, warmup = argv[1], argv[2], int(argv[3]), int(argv[4])
        worker(impl, collective, steps, warmup)
        return 0
    return print_tables(run(build_parser().parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
