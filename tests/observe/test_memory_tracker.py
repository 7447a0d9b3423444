"""The memory tracker (`Accelerator.track_memory`, a hasten extension): background samples of this process's
resident memory written as JSON and a PNG plot, with peaks that agree with what /proc reports."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest
import torch

from hasten import Accelerator
from hasten.observe.memory_tracker import MemoryTracker, current_rss_bytes

needs_proc = pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads /proc (Linux)")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _vm_rss() -> int:
    with open("/proc/self/status") as stream:
        return next(int(line.split()[1]) * 1024 for line in stream if line.startswith("VmRSS:"))


def _wait_for_samples(tracker, count: int) -> None:
    before = len(tracker._columns["time_s"])
    deadline = time.monotonic() + 30
    while len(tracker._columns["time_s"]) < before + count and time.monotonic() < deadline:
        time.sleep(tracker.interval)


@needs_proc
def test_peak_rss_matches_proc_with_a_large_tensor_held(tmp_path):
    pytest.importorskip("matplotlib")
    size = 400 * 1024 * 1024
    accelerator = Accelerator(cpu=True)
    with accelerator.track_memory(tmp_path, interval=0.02) as tracker:
        assert tracker.running and threading.active_count() >= 2
        _wait_for_samples(tracker, 3)
        baseline = current_rss_bytes()
        tracker.mark("allocate")
        big = torch.ones(size // 4)  # written, so every page is resident
        _wait_for_samples(tracker, 5)
        held = _vm_rss()  # what /proc says while the tensor is alive: the peak of this window
        del big
        tracker.mark("free")
        _wait_for_samples(tracker, 3)
    assert not tracker.running
    assert not any(t.name.startswith("hasten-memory-tracker") for t in threading.enumerate())

    report = json.loads((tmp_path / "memory_rank0.json").read_text())
    assert report == tracker.report
    assert report["rank"] == 0 and report["device"] == "cpu" and report["interval_s"] == 0.02
    samples = report["samples"]
    assert set(samples) == {"time_s", "rss_bytes"} and len(samples["time_s"]) == len(samples["rss_bytes"]) >= 11
    assert samples["time_s"] == sorted(samples["time_s"])
    peak = report["peaks"]["rss_bytes"]
    assert abs(peak - held) <= 0.10 * held, (peak, held)
    assert peak - baseline >= 0.9 * size  # the tensor made the peak
    assert samples["rss_bytes"][-1] < peak - 0.5 * size  # and its release shows in the last sample
    assert report["peaks"]["vm_hwm_bytes"] >= peak * 0.99
    assert [m["label"] for m in report["marks"]] == ["allocate", "free"]

    png = (tmp_path / "memory_rank0.png").read_bytes()
    assert png.startswith(PNG_SIGNATURE) and b"IHDR" in png[:32] and png.rstrip().endswith(b"IEND\xaeB`\x82")
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert width >= 600 and height >= 200


def test_default_folder_is_under_the_project_and_json_only_without_plot(tmp_path, monkeypatch):
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")  # without the project folder nothing lands in the caller's folder
    accelerator = Accelerator(cpu=True, project_dir=str(tmp_path))
    tracker = accelerator.track_memory(plot=False, interval=0.05).start()
    report = tracker.stop()
    assert tracker.json_path == str(tmp_path / "memory" / "memory_rank0.json")
    assert os.listdir(tmp_path / "memory") == ["memory_rank0.json"]
    assert len(report["samples"]["time_s"]) >= 2  # one at start, one at stop


def test_misuse_is_refused_in_one_line(tmp_path):
    for bad in (0, -1, "1s", True):
        with pytest.raises(ValueError, match="interval must be a positive number of seconds"):
            MemoryTracker(tmp_path, interval=bad)
    tracker = MemoryTracker(tmp_path, plot=False)
    with pytest.raises(RuntimeError, match="not running; call start"):
        tracker.stop()
    with pytest.raises(RuntimeError, match="call start"):
        tracker.mark("x")
    with tracker:
        with pytest.raises(RuntimeError, match="already running"):
            tracker.start()


def test_missing_matplotlib_gives_an_install_hint_before_the_run(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    with pytest.raises(ImportError, match=r'pip install "hasten\[plots\]"'):
        MemoryTracker(tmp_path).start()
    assert not os.listdir(tmp_path)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="samples the CUDA allocator")
def test_cuda_allocator_is_sampled(tmp_path):
    with MemoryTracker(tmp_path, interval=0.02, device="cuda", plot=False) as tracker:
        big = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")
        _wait_for_samples(tracker, 3)
        del big
    peaks = tracker.report["peaks"]
    assert peaks["cuda_allocated_bytes"] >= 256 * 1024 * 1024 <= peaks["cuda_reserved_bytes"]


def test_a_run_that_never_stops_the_tracker_still_leaves_its_json(tmp_path):
    import subprocess
    import sys

    code = ("from hasten.observe.memory_tracker import MemoryTracker; "
            f"MemoryTracker({str(tmp_path)!r}, interval=0.01, rank=3, plot=False).start(); "
            "import time; time.sleep(0.1)")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    report = json.loads((tmp_path / "memory_rank3.json").read_text())
    assert report["rank"] == 3 and len(report["samples"]["time_s"]) >= 3
