"""A pytest plugin (`-p gpu_results`, loaded by scripts/gpu_run.py): one line is appended to the file named by
HASTEN_GPU_RESULTS when each case starts and when it ends, written through at once, so that a run stopped at any
moment (a case's bound, the command's limit) keeps every result it reached."""

from __future__ import annotations

import json
import os
import time


# read once, at load: the suite's fixtures clear HASTEN_* variables around each test
PATH = os.environ.get("HASTEN_GPU_RESULTS")


def _append(record: dict) -> None:
    path = PATH
    if not path:
        return
    with open(path, "a") as handle:
        handle.write(json.dumps(record) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def pytest_runtest_logstart(nodeid, location):
    _append({"case": nodeid, "event": "start", "at": time.time()})


def pytest_runtest_logreport(report):
    # one end per case: its call, or the setup that skipped or failed it; a failing teardown adds a second
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed") or report.failed:
        message = ""
        if report.skipped and isinstance(report.longrepr, tuple):
            message = str(report.longrepr[2])
        elif report.failed:
            message = getattr(report.longrepr, "reprcrash", None)
            message = message.message if message is not None else str(report.longrepr)
        _append({"case": report.nodeid, "event": "end", "outcome": report.outcome, "when": report.when,
                 "seconds": round(report.duration, 2), "message": message.splitlines()[0][:200] if message else "",
                 "at": time.time()})
