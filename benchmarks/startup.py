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


def _run_child(command: list[str], env: dict, timeout: float = 300) -> tuple[float, int]:
    """Wall time of one command and the peak RSS of its largest descendant (bytes)."""
    start = time.perf_counter()
    # A fresh wait4() per command gives the rusage of exactly this child tree.
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _, status, usage = os.wait4(process.pid, 0)
    except BaseException:
        process.kill()
        raise
    elapsed = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    stdout, stderr = process.stdout.read(), process.stderr.read()
    process.stdout.close()
    process.stderr.close()
    if process.returncode != 0:
        raise RuntimeError(
            f"`{' '.join(command)}` exited {process.returncode}\n--- stdout\n{stdout.decode()[-2000:]}\n"
            f"--- stderr\n{stderr.decode()[-2000:]}"
        )
    # ru_maxrss of a waited child is the largest of it and its own waited descendants (KiB on Linux).
    return elapsed, usage.ru_maxrss * 1024


def _alternate(commands: dict[str, list[str]], env: dict, repeats: int, warmup: int = 1):
    names = list(commands)
    times = {n: [] for n in names}
    rss = {n: 0 for n in names}
    for round_index in range(warmup + repeats):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            elapsed, peak = _run_child(commands[name], env)
            if round_index >= warmup:
                times[name].append(elapsed)
                rss[name] = max(rss[name], peak)
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
    times, rss = _alternate(commands, clean_env(), repeats, warmup=0 if args.quick else 1)
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
        times, rss = _alternate(commands, env, repeats, warmup=0 if args.quick else 1)
    finally:
        os.remove(script)
        os.rmdir(workdir)
    med = {name: median(values) for name, values in times.items()}
    table = Table("Launch time of a no-op script on 2 processes (whole command)",
                  ["launcher", "median wall time", "vs torchrun", "peak RSS (largest process)"])
    for name, command in commands.items():
        table.rows.append([name, fmt_time(med[name]), ratio(med[name], med["torchrun"]), fmt_mb(rss[name])])
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
    args = build_parser().parse_args(argv)
    for table in run(args):
        print(table.render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
