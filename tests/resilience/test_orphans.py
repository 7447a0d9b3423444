"""Issue 30, item 12: workers (and their data-loader workers) end when `hasten launch` is SIGKILLed.

Before: torch's agent starts the workers in sessions of their own, so the OOM killer's (or a scheduler's) SIGKILL
of the launcher alone left them running, holding their GPUs. The bound below is generous (a loaded machine); the
workers end within about a second (the parent-death signal) and their data-loader workers within torch's 5 s check.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from hasten.resilience.orphans import launcher_alive, watch_launcher
from launching import SCRIPTS

GONE_WITHIN = 60.0  # seconds; generous: this proves they end, not how fast


def _pids(folder, prefix):
    return [int(name.split("-")[1]) for name in os.listdir(folder) if name.startswith(prefix)]


def test_workers_and_loader_workers_exit_when_the_launcher_is_killed(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HASTEN_", "ACCELERATE_"))}
    command = [sys.executable, "-m", "hasten", "launch", "--num_processes", "2", "--main_process_port", "0",
               str(SCRIPTS / "orphan_worker.py"), str(tmp_path)]
    launcher = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 180
        while len(_pids(tmp_path, "worker-")) < 2 or len(_pids(tmp_path, "loader-")) < 2:
            assert launcher.poll() is None, "the launch ended before its workers started"
            assert time.monotonic() < deadline, "the workers did not start"
            time.sleep(0.2)
        pids = _pids(tmp_path, "worker-") + _pids(tmp_path, "loader-")
        assert all(launcher_alive(pid) for pid in pids)
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
        deadline = time.monotonic() + GONE_WITHIN
        while any(launcher_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = [pid for pid in pids if launcher_alive(pid)]
        assert not left, f"processes {left} outlived their launcher by {GONE_WITHIN:.0f} s"
    finally:
        launcher.kill()
        for pid in _pids(tmp_path, "worker-") + _pids(tmp_path, "loader-"):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def test_outside_hasten_launch_nothing_is_watched():
    assert not watch_launcher({})
    assert not watch_launcher({"HASTEN_LAUNCHER_PID": str(os.getpid())})
    assert not watch_launcher({"HASTEN_LAUNCHER_PID": "not-a-pid"})
