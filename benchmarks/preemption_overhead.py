"""What `handle_preemption=True` costs per optimizer step: the one-integer all_reduce at the step boundary.

Launches itself with `hasten launch --num_processes 2` (gloo, CPU). Each process trains a tiny MLP under DDP with
raw torch (plain DDP loop) and with hasten twice — preemption handling off and on — interleaved, and reports
the median time per step of each side and the ratio on/off. Run: `python -m benchmarks.preemption_overhead`
(`--steps N`, `--rounds R`). Numbers from a shared machine drift: read the ratio within one run.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _model():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))


def worker(steps: int, rounds: int) -> None:
    import torch

    from hasten import Accelerator, ProjectConfiguration
    from hasten.resilience import preemption

    workdir = tempfile.mkdtemp(prefix="hasten-preempt-bench-")
    accelerator = Accelerator(project_config=ProjectConfiguration(
        project_dir=workdir, automatic_checkpoint_naming=True, handle_preemption=True))
    handler = accelerator._preemption
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    raw_model = torch.nn.parallel.DistributedDataParallel(_model())
    raw_optimizer = torch.optim.SGD(raw_model.parameters(), lr=1e-3)
    x, y = torch.randn(16, 32), torch.randn(16, 1)

    blocking_group, flag = torch.distributed.new_group(backend="gloo"), torch.zeros(1, dtype=torch.int64)

    def hasten_steps(on: bool, blocking: bool = False):
        accelerator._preemption = handler if on else None
        start = time.perf_counter()
        for _ in range(steps):
            with accelerator.accumulate(model):
                accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
                optimizer.step()
                optimizer.zero_grad()
            if blocking:  # the alternative design: wait for the agreement inside every step
                torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX, group=blocking_group)
                int(flag.item())
        return (time.perf_counter() - start) / steps

    def raw_steps():
        start = time.perf_counter()
        for _ in range(steps):
            torch.nn.functional.mse_loss(raw_model(x), y).backward()
            raw_optimizer.step()
            raw_optimizer.zero_grad()
        return (time.perf_counter() - start) / steps

    results = {"raw torch": [], "hasten": [], "hasten + handle_preemption": [],
               "hasten + a blocking agreement (not used)": []}
    hasten_steps(True), raw_steps()  # warm-up
    for _ in range(rounds):
        results["raw torch"].append(raw_steps())
        results["hasten"].append(hasten_steps(False))
        results["hasten + handle_preemption"].append(hasten_steps(True))
        results["hasten + a blocking agreement (not used)"].append(hasten_steps(False, blocking=True))
    if accelerator.is_main_process:
        medians = {side: statistics.median(times) for side, times in results.items()}
        print(f"### Preemption handling: time per optimizer step, 2 processes (gloo, CPU), "
              f"{steps} steps x {rounds} rounds\n")
        print("| side | median per step | / raw torch |")
        print("| --- | ---: | ---: |")
        for side, value in medians.items():
            print(f"| {side} | {value * 1e6:.0f} µs | {value / medians['raw torch']:.2f} |")
        added = medians["hasten + handle_preemption"] - medians["hasten"]
        print(f"\nhandle_preemption adds {added * 1e6:.0f} µs per step "
              f"({medians['hasten + handle_preemption'] / medians['hasten']:.3f}x hasten without it).")
    preemption._active.uninstall()
    accelerator.end_training()


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.steps, args.rounds)
        return 0
    command = [sys.executable, "-m", "hasten", "launch", "--num_processes", "2", os.path.abspath(__file__),
               "--worker", "--steps", str(args.steps), "--rounds", str(args.rounds)]
    return subprocess.call(command)


if __name__ == "__main__":
    sys.exit(main())
