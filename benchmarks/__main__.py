"""Run every benchmark and print one Markdown report (and write it with `--output`).

    python -m benchmarks                      # all, at the small sizes below (minutes)
    python -m benchmarks --quick              # all, tiny (the smoke test's size)
    python -m benchmarks --full               # each benchmark at its own default size (1 GB checkpoint, 2 GB big model, ...)
    python -m benchmarks --only startup,ddp_throughput --output docs/benchmarks.md

With `--output FILE`, a file holding the markers `<!-- benchmark results start -->` and
`<!-- benchmark results end -->` gets only the text between them replaced; any other file is overwritten.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import os
import shlex
import subprocess
import sys
import time
import traceback

if __package__ in (None, ""):  # run as `python benchmarks/__main__.py`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks._common import BENCH_DIR, REPO, _git_commit, clean_env, machine_info, render_machine

# Our benchmarks, in report order, with the arguments the default (small) run gives each.
OWN = {
    "step_overhead": ["--repeats", "10"],
    "data_loader": ["--repeats", "10"],
    "ddp_throughput": ["--repeats", "3", "--steps", "200"],
    "startup": ["--repeats", "10", "--launch-repeats", "5"],
    "save_load_state": ["--size-mb", "256", "--repeats", "3"],
    "async_checkpoint": ["--size-mb", "64", "--repeats", "3"],
    "big_model": ["--size-mb", "512", "--repeats", "2"],
}
# Benchmarks written elsewhere, run as scripts when present: their arguments for each size (they have no --quick).
EXTERNAL = {
    "checkpoint_io": {"quick": ["--size-mb", "8", "--repeats", "1"], "small": ["--size-mb", "256"], "full": []},
    "fsdp_vs_ddp": {"quick": ["--dim", "64", "--depth", "2", "--rows", "16", "--steps", "2"], "small": [], "full": []},
    "tp_vs_fsdp": {"quick": ["--dim", "64", "--depth", "2", "--seq", "8", "--rows", "2", "--steps", "2"], "small": [],
                   "full": []},
    "pp_vs_fsdp": {"quick": ["--dim", "64", "--depth", "2", "--seq", "8", "--rows", "2", "--steps", "2"], "small": [],
                   "full": []},
    "sp_vs_ddp": {"quick": ["--quick"], "small": ["--seqs", "1024,2048"], "full": []},
}
START, END = "<!-- benchmark results start -->", "<!-- benchmark results end -->"


def _own(name: str, mode: str, no_accelerate: bool, clock: str) -> str:
    module = importlib.import_module(f"benchmarks.{name}")
    argv = {"quick": ["--quick"], "small": OWN[name], "full": []}[mode]
    if no_accelerate:
        argv = [*argv, "--no-accelerate"]
    parser = module.build_parser()
    if any(action.dest == "clock" for action in parser._actions):
        argv = [*argv, "--clock", clock]
    args = parser.parse_args(argv)
    return "\n".join(table.render() for table in module.run(args))


def _external(name: str, mode: str) -> str:
    command = [sys.executable, "-m", f"benchmarks.{name}", *EXTERNAL[name][mode]]
    out = subprocess.run(command, cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"`{' '.join(command)}` exited {out.returncode}:\n{out.stderr[-3000:]}")
    # Their output is their own format: keep it verbatim.
    return f"### {name} (`{' '.join(['python', *command[1:]])}`)\n\n```\n{out.stdout.strip()}\n```\n"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description="Run hasten's benchmarks side by side.")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="tiny sizes (seconds each; what the smoke test runs)")
    size.add_argument("--full", action="store_true", help="each benchmark's own default size (slow)")
    parser.add_argument("--only", default=None, help=f"comma-separated subset of: {', '.join([*OWN, *EXTERNAL])}")
    parser.add_argument("--no-accelerate", action="store_true", help="leave out the Accelerate columns")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="for the single-process timings: wall time (default) or CPU time (busy machines)")
    parser.add_argument("--output", default=None, help="also write the report to this Markdown file")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    mode = "quick" if args.quick else "full" if args.full else "small"
    names = [*OWN, *(n for n in EXTERNAL if (BENCH_DIR / f"{n}.py").exists())]
    if args.only:
        wanted = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in wanted if n not in OWN and n not in EXTERNAL]
        if unknown:
            print(f"python -m benchmarks: unknown benchmark(s) {', '.join(unknown)}; choose from "
                  f"{', '.join([*OWN, *EXTERNAL])}", file=sys.stderr)
            return 2
        names = [n for n in names if n in wanted]

    command = "python -m benchmarks " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    started = time.perf_counter()
    when = datetime.datetime.now(datetime.timezone.utc)
    load_before = os.getloadavg()[0]  # 1-minute load: how busy the machine was (the ratios hold either way)
    machine = render_machine(machine_info())
    print(f"Command: `{command.strip()}`\n\n{machine}", flush=True)
    sections, failed = [], []
    for name in names:
        print(f"[benchmarks] running {name} ...", file=sys.stderr, flush=True)
        section_start = time.perf_counter()
        try:
            text = _own(name, mode, args.no_accelerate, args.clock) if name in OWN else _external(name, mode)
        except Exception as error:  # one broken benchmark must not cost the others' results
            traceback.print_exc()
            failed.append(name)
            text = f"### {name}\n\nFAILED: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}\n"
        sections.append(text)
        print(text, flush=True)
        print(f"[benchmarks] {name} took {time.perf_counter() - section_start:.0f} s", file=sys.stderr, flush=True)

    report = "\n".join([
        f"Measured {when:%Y-%m-%d %H:%M} UTC on commit {_git_commit()} with `{command.strip()}` "
        f"(size: {mode}; {time.perf_counter() - started:.0f} s in all; load average {load_before:.2f} before, "
        f"{os.getloadavg()[0]:.2f} after).",
        "",
        machine,
        *sections,
    ])
    if args.output:
        _write(args.output, report)
        print(f"[benchmarks] wrote {args.output}", file=sys.stderr)
    return 1 if failed else 0


def _write(path: str, report: str) -> None:
    text = open(path).read() if os.path.exists(path) else ""
    if START in text and END in text:
        head, rest = text.split(START, 1)
        _, tail = rest.split(END, 1)
        text = f"{head}{START}\n{report}\n{END}{tail}"
    else:
        text = report
    with open(path, "w") as f:
        f.write(text)


if __name__ == "__main__":
    sys.exit(main())
