"""Start-up costs: `import hasten` vs `import torch` vs `import accelerate`, and the wall time of launching a
no-op script on 2 processes with `hasten launch` vs `torchrun` vs `accelerate launch`.

Every sample is a whole new process (what a user waits for); sides alternate (ABCABC...) and each is
summarised by its median. The child's peak RSS (ru_maxrss of the children) is reported alongside.
Run: `python -m benchmarks.startup [--quick]`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

if __package__ in (None, ""):  # run as `python benchmarks/startup.py`: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks._common import (
    print_tables,
    ACCELERATE_LEFT_OUT,
    Table,
    base_parser,
    clean_env,
    console_script,
    fmt_mb,
    fmt_time,
    free_port,
    median,
    ratio,
    want_accelerate,
)


# Appended to each `python -c` import line: the program's own peak RSS (VmHWM), printed after the import.
# (ru_maxrss of a child would carry over this large parent's peak through fork and exec.)
PEAK_RSS_EPILOGUE = (";import sys;sys.stdout.write([l for l in open('/proc/self/status') "
                     "if l.startswith('VmHWM')][0])")


def _run_child(command: list[str], env: dict, timeout: float = 300) -> tuple[float, int | None]:
    """Wall time of one command, and the peak RSS (bytes) it printed, if it printed one."""
    start = time.perf_counter()
    out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    elapsed = time.perf_counter() - start
    if out.returncode != 0:
        raise RuntimeError(
            f"`{' '.join(command)}` exited {out.returncode}\n--- stdout\n{out.stdout[-2000:]}\n"
            f"--- stderr\n{out.stderr[-2000:]}"
        )
    peak = None
    for line in out.stdout.splitlines():
        if line.startswith("VmHWM:"):
            peak = int(line.split()[1]) * 1024
    return elapsed, peak


def _alternate(commands: dict[str, list[str]], env: dict, repeats: int, warmup: int = 1):
    names = list(commands)
    times = {n: [] for n in names}
    rss = {n: None for n in names}
    for round_index in range(warmup + repeats):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            elapsed, peak = _run_child(commands[name], env)
            if round_index >= warmup:
                times[name].append(elapsed)
                if peak is not None:
                    rss[name] = max(rss[name] or 0, peak)
    return times, rss


def import_table(args) -> Table:
    repeats = args.repeats or (2 if args.quick else 15)
    py = sys.executable
    commands = {
        "python (nothing)": [py, "-c", "pass"],
        "import torch": [py, "-c", "import torch"],
        "import hasten": [py, "-c", "import hasten"],
        "hasten Accelerator": [py, "-c", "from hasten import Accelerator"],
    }
    if want_accelerate(args):
        commands["import accelerate"] = [py, "-c", "import accelerate"]
        commands["accelerate Accelerator"] = [py, "-c", "from accelerate import Accelerator"]
    measured = {name: [*command[:-1], command[-1] + PEAK_RSS_EPILOGUE] for name, command in commands.items()}
    times, rss = _alternate(measured, clean_env(), repeats, warmup=0 if args.quick else 1)
    med = {name: median(values) for name, values in times.items()}
    table = Table("Import time (whole process)", ["command", "median wall time", "minus `import torch`",
                                                  "vs `import torch`", "peak RSS"])
    for name in commands:
        extra = med[name] - med["import torch"]
        table.rows.append([f"`python -c \"{commands[name][2]}\"`", fmt_time(med[name]),
                           f"{extra * 1e3:+.0f} ms", ratio(med[name], med["import torch"]), fmt_mb(rss[name])])
    table.notes.append(f"{repeats} runs per command after {0 if args.quick else 1} warm-up round, interleaved.")
    table.notes.append("`import hasten` loads its public names on first use, so `from hasten import Accelerator` "
                       "(which loads torch) is the number to hold against the target: within 50 ms of `import torch`.")
    return table


def launch_table(args) -> Table:
    repeats = args.launch_repeats or (1 if args.quick else 5)
    workdir = tempfile.mkdtemp(prefix="hasten-bench-launch-")
    script = os.path.join(workdir, "noop.py")
    with open(script, "w") as f:
        f.write("# a training script that does nothing: the launch itself is what is timed\n")
    commands = {
        "torchrun": [*console_script("torchrun"), "--standalone", "--nproc_per_node", "2", script],
        "hasten launch": [*console_script("hasten"), "launch", "--cpu", "--num_processes", "2", script],
    }
    if want_accelerate(args):
        # `--multi_gpu` so that Accelerate really starts 2 processes (through torchrun) on a CPU machine.
        commands["accelerate launch"] = [*console_script("accelerate"), "launch", "--multi_gpu", "--num_processes",
                                         "2", "--num_machines", "1", "--mixed_precision", "no",
                                         "--dynamo_backend", "no", "--main_process_port", str(free_port()), script]
    env = clean_env(OMP_NUM_THREADS="1", ACCELERATE_USE_CPU="true")
    try:
        times, _ = _alternate(commands, env, repeats, warmup=0 if args.quick else 1)
    finally:
        os.remove(script)
        os.rmdir(workdir)
    med = {name: median(values) for name, values in times.items()}
    table = Table("Launch time of a no-op script on 2 processes (whole command)",
                  ["launcher", "median wall time", "min – max", "vs torchrun"])
    for name in commands:
        table.rows.append([name, fmt_time(med[name]), f"{fmt_time(min(times[name]))} – {fmt_time(max(times[name]))}",
                           ratio(med[name], med["torchrun"])])
    shown = {name: " ".join(os.path.basename(part) if i == 0 else part for i, part in enumerate(command))
             for name, command in commands.items()}
    table.notes.append(f"{repeats} launches per launcher after {0 if args.quick else 1} warm-up round, interleaved; "
                       "OMP_NUM_THREADS=1.")
    table.notes.append("Commands: " + "; ".join(f"`{c.replace(script, 'noop.py')}`" for c in shown.values()))
    table.notes.append("Target: hasten launch within 10% of torchrun.")
    return table


def run(args) -> list[Table]:
    tables = [import_table(args), launch_table(args)]
    if not want_accelerate(args):
        for table in tables:
            table.notes.append(ACCELERATE_LEFT_OUT)
    return tables


def build_parser():
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--launch-repeats", type=int, default=None, help="launches per launcher (default 5)")
    return parser


def main(argv=None) -> int:
    return print_tables(run(build_parser().parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
