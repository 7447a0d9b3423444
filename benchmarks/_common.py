"""Shared pieces of the benchmarks: alternating repetitions, medians, Markdown tables, machine facts.

Every benchmark compares several *sides* (hasten, raw PyTorch, Accelerate) of the same work. Timings on a
shared machine drift, so the sides are interleaved (ABCABC...) rather than run one after another, and each
side is summarised by the median of its repetitions.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import shutil
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BENCH_DIR = Path(__file__).resolve().parent

# The sides, in the order columns are printed. Ratios are taken against RAW.
HASTEN, RAW, ACCELERATE = "hasten", "raw torch", "accelerate"
ACCELERATE_LEFT_OUT = "Accelerate left out (`--no-accelerate`, or not installed: `pip install -e '.[bench]'`)."


def accelerate_available() -> bool:
    return importlib.util.find_spec("accelerate") is not None


def hasten_module_available(name: str) -> bool:
    """Whether `hasten.<name>` exists in this checkout (some rooms land later than the benchmarks)."""
    return importlib.util.find_spec(f"hasten.{name}") is not None


@dataclass
class Table:
    """One Markdown table of results, with the notes that explain it (skips, targets, units)."""

    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def render(self) -> str:
        lines = [f"### {self.title}", ""]
        lines.append("| " + " | ".join(self.columns) + " |")
        lines.append("|" + "|".join(" --- " for _ in self.columns) + "|")
        for row in self.rows:
            lines.append("| " + " | ".join(str(cell) for cell in row) + " |")
        if self.notes:
            lines.append("")
            lines.extend(f"- {note}" for note in self.notes)
        return "\n".join(lines) + "\n"


def interleave(sides: dict, repeats: int, warmup: int = 1) -> dict[str, list[float]]:
    """Call each side's function in turn (ABCABC...), `warmup` untimed rounds then `repeats` timed ones.

    Each function returns the number it measured (seconds, or a rate); the result maps side -> samples.
    The starting side rotates every round so that no side always runs right after the same other side.
    """
    names = list(sides)
    samples = {name: [] for name in names}
    for round_index in range(warmup + repeats):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            value = sides[name]()
            if round_index >= warmup:
                samples[name].append(value)
    return samples


def median(values) -> float:
    return statistics.median(values) if values else float("nan")


def spread(values) -> float:
    """Half the interquartile range relative to the median: a rough +/- for the table."""
    if len(values) < 4:
        return float("nan")
    q1, _, q3 = statistics.quantiles(values, n=4)
    mid = statistics.median(values)
    return (q3 - q1) / 2 / mid if mid else float("nan")


def ratio(value: float, reference: float) -> str:
    if value != value or reference != reference or not reference:  # NaN or zero
        return "—"
    return f"{value / reference:.3f}"


def fmt_time(seconds: float) -> str:
    if seconds != seconds:
        return "—"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def fmt_mb(num_bytes: float | None) -> str:
    return "—" if num_bytes is None else f"{num_bytes / 2**20:.0f} MB"


def machine_info() -> dict[str, str]:
    import torch

    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info = {
        "cpu": cpu or "unknown",
        "cores": str(os.cpu_count()),
        "memory": _total_memory(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch default threads": str(torch.get_num_threads()),
    }
    try:
        from importlib.metadata import version

        info["hasten"] = version("hasten")
    except Exception:
        info["hasten"] = "unknown"
    info["hasten commit"] = _git_commit()
    if accelerate_available():
        from importlib.metadata import version

        info["accelerate"] = version("accelerate")
    else:
        info["accelerate"] = "not installed"
    return info


def _total_memory() -> str:
    try:
        import psutil

        return f"{psutil.virtual_memory().total / 2**30:.1f} GiB"
    except Exception:
        return "unknown"


def _git_commit() -> str:
    """The measured checkout's commit, with `+changes` when tracked files differ from it."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                             timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    commit = out.stdout.strip() or "unknown"
    return commit + ("+changes" if dirty and commit != "unknown" else "")


def render_machine(info: dict[str, str]) -> str:
    return "\n".join(f"- **{key}**: {value}" for key, value in info.items()) + "\n"


def base_parser(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="tiny sizes and few repetitions (smoke test)")
    parser.add_argument("--repeats", type=int, default=None, help="timed repetitions per side")
    parser.add_argument("--no-accelerate", action="store_true", help="leave out the Accelerate column")
    return parser


def print_tables(tables) -> int:
    """The body of every benchmark's `main`: print each table it measured."""
    for table in tables:
        print(table.render())
    return 0


CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}


def add_clock_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--clock", choices=sorted(CLOCKS), default="wall",
        help="wall: elapsed time (default); cpu: this thread's CPU time, steadier on a busy machine "
             "(these benchmarks run on one thread)",
    )


def want_accelerate(args) -> bool:
    return not getattr(args, "no_accelerate", False) and accelerate_available()


def console_script(name: str) -> list[str]:
    """The command for a console script installed next to this interpreter (hasten, torchrun, accelerate)."""
    local = Path(sys.executable).parent / name
    if local.exists():
        return [str(local)]
    found = shutil.which(name)
    if found:
        return [found]
    modules = {"torchrun": "torch.distributed.run", "hasten": "hasten", "accelerate": "accelerate.commands.accelerate_cli"}
    return [sys.executable, "-m", modules[name]]


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def clean_env(**extra) -> dict[str, str]:
    """The environment for child processes: no HASTEN_/ACCELERATE_ settings leaking in from outside."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HASTEN_", "ACCELERATE_"))}
    env.setdefault("PYTHONUNBUFFERED", "1")
    # Make `benchmarks` importable by child scripts however the parent was started.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.update(extra)
    return env


class PeakRSS:
    """Samples this process's resident memory in a background thread; `peak` is the largest seen (bytes).

    Only for I/O-bound work: the sampler holds the GIL briefly every `interval` seconds.
    """

    def __init__(self, interval: float = 0.005):
        import psutil

        self._process = psutil.Process()
        self._interval = interval
        self._stop = threading.Event()
        self.baseline = self._process.memory_info().rss
        self.peak = self.baseline
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self._process.memory_info().rss)
            self._stop.wait(self._interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._process.memory_info().rss)

    @property
    def growth(self) -> int:
        return self.peak - self.baseline


def peak_rss_bytes() -> int:
    """Peak resident memory of the program running in this process (VmHWM), in bytes.

    Not `ru_maxrss`: the kernel carries that high-water mark over from the parent through fork and exec, so
    a small child of a large process would report the parent's peak.
    """
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start
