"""Workers end with their launcher: a worker whose `hasten launch` was killed exits within a second or two.

Why: torch's agent starts each worker in a session of its own, so when the launcher dies without a chance to
stop them (SIGKILL from the OOM killer, or a scheduler that kills the launcher alone), nothing tells them:
measured on CPU, the workers went on training and writing checkpoints; on a GPU node they keep its memory until
someone hunts them down. Two guards, both started when the worker joins the process group:

- the parent-death signal (Linux `prctl(PR_SET_PDEATHSIG, SIGKILL)`), set when the launcher is this process's
  parent: the kernel kills the worker the moment the launcher ends, even while Python is stuck in C code;
- a watchdog thread on the launcher's pid (`HASTEN_LAUNCHER_PID`, which `hasten launch` exports), for where the
  signal cannot be used (another OS, a wrapper process between launcher and worker): once the launcher is gone,
  it kills the worker's process group.

The worker leads its own process group (its own session), which holds its data-loader workers: the watchdog
kills them with it. Under the parent-death signal alone they follow through torch's own check of their parent
(every 5 s while they wait for work).
"""

from __future__ import annotations

import os
import signal
import threading

LAUNCHER_PID_VARIABLE = "HASTEN_LAUNCHER_PID"
POLL_SECONDS = 0.5
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

_watching: int | None = None  # the pid being watched (once per process)


def launcher_environment() -> dict:
    """What `hasten launch` adds to its workers' environment: its own pid."""
    return {LAUNCHER_PID_VARIABLE: str(os.getpid())}


def watch_launcher(env=None) -> bool:
    """Arrange for this process (and its process group, when it leads one) to end when the launcher ends.
    Returns whether a launcher is being watched. Nothing happens outside `hasten launch`."""
    global _watching
    env = os.environ if env is None else env
    text = env.get(LAUNCHER_PID_VARIABLE, "")
    if not text.isdigit() or int(text) == os.getpid():
        return False
    launcher = int(text)
    if _watching == launcher:
        return True
    if os.getppid() == launcher:
        die_with_parent()
    if not launcher_alive(launcher):  # it died before either guard was in place
        _end_this_worker()
    _watching = launcher
    threading.Thread(target=_watch, args=(launcher, os.getppid()), name="hasten-launcher-watchdog",
                     daemon=True).start()
    return True


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """`prctl(PR_SET_PDEATHSIG, sig)` (Linux): the kernel sends `sig` when the parent ends. False elsewhere."""
    import sys

    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def launcher_alive(pid: int) -> bool:
    """Whether `pid` still runs: it exists and is not a zombie (a killed launcher stays one until reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else (a reused pid): not our launcher any more
        return False
    try:
        with open(f"/proc/{pid}/stat") as handle:
            state = handle.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")


def _watch(launcher: int, parent: int) -> None:
    import time

    while True:
        time.sleep(POLL_SECONDS)
        # A worker whose parent was the launcher is reparented the moment the launcher exits, zombie or not.
        if (parent == launcher and os.getppid() != launcher) or not launcher_alive(launcher):
            _end_this_worker()
            return


def _end_this_worker() -> None:
    """SIGKILL this process's group when it leads one (itself and its data-loader workers), else itself."""
    if hasattr(os, "getpgid") and os.getpgid(0) == os.getpid():
        os.killpg(os.getpid(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)
