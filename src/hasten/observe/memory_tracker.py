"""A memory tracker: a daemon thread samples this process's resident memory (and, on CUDA, torch's allocated and
reserved memory) at a fixed interval, and on stop writes `memory_rank<r>.json` (samples and peaks) and
`memory_rank<r>.png` (a plot a person can read) into an output folder. A hasten extension
(`Accelerator.track_memory`); see docs/observability.md.

Resident memory comes from /proc/self/statm (one read per sample, no psutil). Where /proc does not exist (macOS,
Windows) the samples hold no RSS and the peak comes from `resource.getrusage`.
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import logging
import os
import threading
import time

import torch

logger = logging.getLogger(__name__)

MIB = 1024 * 1024
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def current_rss_bytes() -> int | None:
    """This process's resident set size now, or None where /proc is not available."""
    try:
        with open("/proc/self/statm", "rb") as stream:
            return int(stream.read().split()[1]) * _PAGE_SIZE
    except OSError:
        return None


def peak_rss_bytes() -> int | None:
    """The kernel's high-water mark of this process's resident memory (VmHWM), since the process started."""
    try:
        with open("/proc/self/status", encoding="ascii") as stream:
            for line in stream:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # reported in kB
    except OSError:
        pass
    try:
        import resource
        import sys

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, kB elsewhere
    except (ImportError, OSError):
        return None


def _plot_available() -> None:
    if importlib.util.find_spec("matplotlib") is None:
        raise ImportError('the memory tracker draws its plot with matplotlib: pip install "hasten[plots]" '
                          "(or pass plot=False to write the JSON only)")


class MemoryTracker:
    """Samples memory every `interval` seconds between `start()` and `stop()` (or inside a `with` block).

    `output_dir` receives `memory_rank<rank>.json` and, with `plot=True`, `memory_rank<rank>.png`. `device` is
    the torch device whose allocator is sampled when it is a CUDA device; on any other device only RSS is sampled.
    `mark(label)` puts a labelled line on the plot (an epoch, an evaluation, a checkpoint).
    """

    def __init__(self, output_dir, interval: float = 0.5, rank: int = 0, device=None, plot: bool = True):
        if not isinstance(interval, (int, float)) or isinstance(interval, bool) or interval <= 0:
            raise ValueError(f"MemoryTracker interval must be a positive number of seconds, got {interval!r}")
        self.output_dir = os.fspath(output_dir)
        self.interval = float(interval)
        self.rank = int(rank)
        device = torch.device(device) if device is not None else torch.device("cpu")
        self.cuda_device = device if device.type == "cuda" and torch.cuda.is_available() else None
        self.plot = plot
        self.report: dict | None = None
        self._columns = {"time_s": [], "rss_bytes": []}
        if self.cuda_device is not None:
            self._columns.update(cuda_allocated_bytes=[], cuda_reserved_bytes=[])
        self._marks: list[dict] = []
        self._started = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = None

    @property
    def json_path(self) -> str:
        return os.path.join(self.output_dir, f"memory_rank{self.rank}.json")

    @property
    def plot_path(self) -> str:
        return os.path.join(self.output_dir, f"memory_rank{self.rank}.png")

    @property
    def running(self) -> bool:
        return self._thread is not None

    def start(self) -> "MemoryTracker":
        if self.running:
            raise RuntimeError("this MemoryTracker is already running; call stop() before starting it again")
        if self.plot:
            _plot_available()  # fail now, not after the run
        self._started = time.monotonic()
        self._stop.clear()
        self._sample()
        self._thread = threading.Thread(target=self._run, name=f"hasten-memory-tracker-rank{self.rank}", daemon=True)
        self._thread.start()
        atexit.register(self._stop_at_exit)  # a run that ends without stop() still leaves its files
        return self

    def mark(self, label: str) -> None:
        """Note an event at this moment; it appears in the JSON and as a labelled line on the plot."""
        if self._started is None:
            raise RuntimeError("MemoryTracker.mark() needs a started tracker; call start() first")
        with self._lock:
            self._marks.append({"time_s": time.monotonic() - self._started, "label": str(label)})

    def stop(self) -> dict:
        """Stop sampling, write the JSON (and plot) and return the report written."""
        if not self.running:
            raise RuntimeError("this MemoryTracker is not running; call start() first")
        self._stop.set()
        self._thread.join()
        self._thread = None
        atexit.unregister(self._stop_at_exit)
        self._sample()
        self.report = self._build_report()
        os.makedirs(self.output_dir, exist_ok=True)
        temporary = self.json_path + ".tmp"
        with open(temporary, "w", encoding="utf-8") as stream:
            json.dump(self.report, stream, indent=1)
        os.replace(temporary, self.json_path)
        if self.plot:
            self._draw()
        return self.report

    def __enter__(self) -> "MemoryTracker":
        return self.start()

    def __exit__(self, *exc_info) -> bool:
        self.stop()
        return False

    # -- sampling --------------------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def _sample(self) -> None:
        now = time.monotonic() - self._started
        rss = current_rss_bytes()
        with self._lock:
            self._columns["time_s"].append(round(now, 6))
            self._columns["rss_bytes"].append(rss)
            if self.cuda_device is not None:
                self._columns["cuda_allocated_bytes"].append(torch.cuda.memory_allocated(self.cuda_device))
                self._columns["cuda_reserved_bytes"].append(torch.cuda.memory_reserved(self.cuda_device))

    def _stop_at_exit(self) -> None:
        if self.running:
            try:
                self.stop()
            except Exception as error:  # noqa: BLE001 - at exit there is no caller left to raise to
                logger.warning("memory tracker of rank %d could not write its files at exit: %s", self.rank, error)

    def _build_report(self) -> dict:
        with self._lock:
            columns = {name: list(values) for name, values in self._columns.items()}
            marks = list(self._marks)
        rss = [value for value in columns["rss_bytes"] if value is not None]
        peaks = {"rss_bytes": max(rss) if rss else None, "vm_hwm_bytes": peak_rss_bytes()}
        if self.cuda_device is not None:
            peaks["cuda_allocated_bytes"] = max(columns["cuda_allocated_bytes"])
            peaks["cuda_reserved_bytes"] = max(columns["cuda_reserved_bytes"])
            # torch's own high-water mark catches a spike between two samples (since start or the last reset).
            peaks["cuda_max_allocated_bytes"] = torch.cuda.max_memory_allocated(self.cuda_device)
        return {
            "rank": self.rank,
            "device": str(self.cuda_device or "cpu"),
            "interval_s": self.interval,
            "duration_s": columns["time_s"][-1],
            "units": "bytes",
            "peaks": peaks,
            "marks": marks,
            "samples": columns,
        }

    # -- the plot --------------------------------------------------------------------------------------------
    def _draw(self) -> None:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        report = self.report
        samples = report["samples"]
        panels = [("CPU resident memory (RSS)", [("rss_bytes", "RSS")])]
        if "cuda_allocated_bytes" in samples:
            panels.append((f"{report['device']} memory", [("cuda_allocated_bytes", "allocated"),
                                                           ("cuda_reserved_bytes", "reserved")]))
        # Figure + Agg canvas directly (no pyplot): no global state, safe off the main thread.
        figure = Figure(figsize=(9, 3.2 * len(panels)), layout="constrained")
        FigureCanvasAgg(figure)
        axes = figure.subplots(len(panels), 1, squeeze=False)[:, 0]
        for axis, (title, series) in zip(axes, panels):
            for column, label in series:
                points = [(t, v / MIB) for t, v in zip(samples["time_s"], samples[column]) if v is not None]
                if points:
                    peak = max(v for _, v in points)
                    axis.plot([t for t, _ in points], [v for _, v in points], label=f"{label} (peak {peak:,.0f} MiB)")
            for mark in report["marks"]:
                axis.axvline(mark["time_s"], color="grey", linestyle=":", linewidth=1)
                axis.annotate(mark["label"], (mark["time_s"], 1), xycoords=("data", "axes fraction"),
                              rotation=90, va="top", ha="right", fontsize=8, color="grey")
            axis.set_title(f"rank {report['rank']}: {title}")
            axis.set_xlabel("seconds since start")
            axis.set_ylabel("MiB")
            axis.grid(alpha=0.3)
            axis.legend(loc="best")
        temporary = self.plot_path + ".tmp.png"
        figure.savefig(temporary, dpi=100)
        os.replace(temporary, self.plot_path)


def track_memory(accelerator, output_dir=None, interval: float = 0.5, plot: bool = True) -> MemoryTracker:
    """A `MemoryTracker` for this process of `accelerator`'s run (not started: use it in a `with` block or call
    `start()`); files go to `output_dir`, by default `<project_dir>/memory` (or `./memory`)."""
    if output_dir is None:
        output_dir = os.path.join(accelerator.project_dir or ".", "memory")
    return MemoryTracker(output_dir, interval=interval, rank=accelerator.process_index, device=accelerator.device,
                         plot=plot)


__all__ = ["MemoryTracker", "current_rss_bytes", "peak_rss_bytes", "track_memory"]
