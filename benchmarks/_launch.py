"""The harness of the strategy benchmarks (`*_vs_*.py`): launch, collect, tabulate.

Each of those scripts launches itself once per side (`hasten launch --num_processes N script --worker SIDE ...`),
so that every side starts in fresh processes and its peak memory is its own. The workers time their steps, gather
each process's peak memory, and the main process prints one `RESULT {json}` line; the parent collects that line
per side and prints one table (step time and peak memory per process, and their ratios to DDP where it has them).

The worker helpers import torch only when called: the parent never needs it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from functools import cache

RESULT = "RESULT "
HELPS = {"rows": "rows per process per step", "steps": "timed steps (after 2 warm-up steps)"}


# --- the parent: options, launching, collecting ---------------------------------------------------------------

def worker_or_parent(args, worker, parent) -> int:
    """A script's `main`: run as a side's worker when `--worker` is given, else as the parent that launches them."""
    if args.worker:
        worker(args)
        return 0
    return parent(args)


def strategy_parser(description: str, sides, helps: dict | None = None, **sizes) -> argparse.ArgumentParser:
    """A parser with the hidden `--worker SIDE` and one `--NAME` option per size, in order, typed as its default."""
    helps = {**HELPS, **(helps or {})}
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--worker", choices=sides, help=argparse.SUPPRESS)
    for name, default in sizes.items():
        parser.add_argument(f"--{name}", type=type(default), default=default, help=helps.get(name))
    return parser


def forward(args, *names: str) -> list[str]:
    """The parent's options `names` as `--name=value` arguments for the worker."""
    return [f"--{name}={getattr(args, name)}" for name in names]


def launch_env(*prefixes: str) -> dict[str, str]:
    """This environment without the variables that start with `prefixes` (settings that would steer a side)."""
    return {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}


def hasten_command(script: str, num_processes: int, worker_argv, launcher_args=()) -> list[str]:
    return [sys.executable, "-m", "hasten", "launch", "--num_processes", str(num_processes), *launcher_args, script,
            *worker_argv]


@dataclass
class Launched:
    """One side's run: the launcher's exit status and output, and the first RESULT line's values (None: failed)."""

    returncode: int
    stdout: str
    stderr: str
    result: dict | None

    def error(self) -> str:
        """The last output line that names an Error (160 characters at most), else "no result"."""
        errors = [line for line in (self.stderr + self.stdout).splitlines() if "Error" in line]
        return (errors or ["no result"])[-1][:160]

    def print_tail(self, chars: int) -> None:
        print(self.stdout[-chars:], self.stderr[-chars:], file=sys.stderr)


def launch(command: list[str], env: dict[str, str]) -> Launched:
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
    result = json.loads(lines[0][len(RESULT):]) if done.returncode == 0 and lines else None
    return Launched(done.returncode, done.stdout, done.stderr, result)


def launch_all(commands, env: dict[str, str]) -> list[dict] | None:
    """Each command's result in turn; at the first failure, the tail of its output on stderr and None."""
    results = []
    for command in commands:
        launched = launch(command, env)
        if launched.result is None:
            launched.print_tail(3000)
            return None
        results.append(launched.result)
    return results


# --- the parent: the table ------------------------------------------------------------------------------------

def params_text(params: int) -> str:
    return f"{params / 1e6:.1f}M parameters ({params * 4 / 2**20:.0f} MiB fp32)"


def peaks_text(result: dict) -> str:
    """Each process's peak memory in MiB, `a / b`."""
    return " / ".join(f"{p:.0f}" for p in result["peak_mib"])


def step_ratio(result: dict, reference: dict) -> float:
    return result["step_s"] / reference["step_s"]


def memory_ratio(result: dict, reference: dict) -> float:
    """The largest peak of one process over the reference's largest."""
    return max(result["peak_mib"]) / max(reference["peak_mib"])


def print_strategy_table(results: list[dict], peak_header: str = "peak memory per process (MiB)",
                         ratios: bool = True) -> None:
    """A plain-text table, one row per strategy; with `ratios`, step time and memory against the first row."""
    first = results[0]
    ratio_column = [(f"x {first['strategy']}", ">8")] if ratios else []
    columns = [("strategy", "<10"), ("step time (s)", ">15"), *ratio_column,
               (peak_header, f">{len(peak_header) + 5}"), *ratio_column]
    print("".join(f"{header:{spec}}" for header, spec in columns))
    for r in results:
        step, peaks = f"{r['step_s']:.3f}", peaks_text(r)
        cells = [r["strategy"], step, f"{step_ratio(r, first):.2f}", peaks, f"{memory_ratio(r, first):.2f}"] \
            if ratios else [r["strategy"], step, peaks]
        print("".join(f"{cell:{spec}}" for cell, (_, spec) in zip(cells, columns)))


def markdown_row(cells) -> str:
    """`| a | b |`; an empty cell is `| |`."""
    return "|" + "|".join(f" {cell} " if cell != "" else " " for cell in cells) + "|"


def markdown_head(columns) -> str:
    return markdown_row(columns) + "\n" + markdown_row(["---"] * len(columns))


# --- the workers ----------------------------------------------------------------------------------------------

def kib(field: str) -> int:
    """A `/proc/self/status` field in KiB: VmRSS (resident now) or VmHWM (this program's peak, not its parent's)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def timed_steps(step, batches, warmup: int, steps: int, barrier) -> float:
    """The median time of `step(batch)` over `steps` batches after `warmup` untimed ones.

    Each batch is drawn before the first barrier, outside the time; a barrier on each side of the step makes the
    time the slowest process's.
    """
    times = []
    for index, batch in enumerate(batches):
        if index >= warmup + steps:
            break
        barrier()
        start = time.perf_counter()
        step(batch)
        barrier()
        if index >= warmup:
            times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def gather_peaks_mib(peak_kib: float) -> list[float]:
    """Every process's peak (given in KiB), in MiB, in rank order."""
    import torch.distributed as dist

    peaks = [None] * dist.get_world_size()
    dist.all_gather_object(peaks, peak_kib)
    return [p / 1024 for p in peaks]


def report(result: dict) -> None:
    """The worker's one result line for the parent (print it on one process only)."""
    print(RESULT + json.dumps(result), flush=True)


def report_peaks(is_main: bool, baseline_kib: int, **values) -> None:
    """Gather every process's peak memory (VmHWM over `baseline_kib`); the main process reports `values` with them."""
    peaks = gather_peaks_mib(kib("VmHWM") - baseline_kib)
    if is_main:
        report({**values, "peak_mib": peaks})


def mlp_blocks(dim: int, depth: int) -> list:
    """`depth` residual MLP blocks (LayerNorm, Linear to 4 x dim, GELU, Linear back), of a class named `Block`."""
    block = _mlp_block_class()
    return [block(dim) for _ in range(depth)]


@cache
def _mlp_block_class():
    import torch

    class Block(torch.nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.norm = torch.nn.LayerNorm(dim)
            self.up = torch.nn.Linear(dim, 4 * dim)
            self.down = torch.nn.Linear(4 * dim, dim)

        def forward(self, x):
            return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))

    return Block
