"""The pytest side of scripts/prove_honoured.py (loaded with `-p honoured_plugin`).

HONOURED_PLAN (JSON) maps a test function ("tests/x.py::test_name") to the entries whose mutants it must kill.
Each collected case of such a test runs once as it is (the baseline; HONOURED_BASELINE=0 skips it, trusting the
ordinary suite) and then once per entry with that entry's
mutant live (HONOURED_MUTANT, read by scripts/honoured_hook.py at call time); an entry already killed skips the
remaining cases. Results go to HONOURED_REPORT as JSON lines.
"""

import json
import os
import time

import pytest
from _pytest.runner import runtestprotocol

_PLAN = json.loads(os.environ.get("HONOURED_PLAN") or "{}")
_KILLED = set()
_BASELINE_FAILED = set()


def _record(**row) -> None:
    with open(os.environ["HONOURED_REPORT"], "a") as out:
        out.write(json.dumps(row) + "\n")


def _run(item) -> tuple:
    started = time.monotonic()
    reports = runtestprotocol(item, log=False, nextitem=None)
    failed = [r for r in reports if r.failed]
    skipped = any(r.skipped for r in reports) and not failed
    message = ""
    if failed:
        text = str(failed[0].longrepr)
        message = next((line for line in text.splitlines() if line.startswith("E ")), text.splitlines()[-1] if text else "")
    return bool(failed), skipped, time.monotonic() - started, message[:200]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    test = item.nodeid.split("[", 1)[0]
    entries = _PLAN.get(test)
    if entries is None:
        return None
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    os.environ.pop("HONOURED_MUTANT", None)
    if os.environ.get("HONOURED_BASELINE", "1") == "1":
        failed, skipped, seconds, message = _run(item)
        _record(entry=None, test=item.nodeid, failed=failed, skipped=skipped, seconds=seconds, message=message)
        if failed or skipped:
            _BASELINE_FAILED.add(test)
            return True
    hits = os.environ["HONOURED_HITS"]
    for entry in entries:
        if entry in _KILLED:
            continue
        if os.path.exists(hits):
            os.remove(hits)
        os.environ["HONOURED_MUTANT"] = entry
        try:
            failed, skipped, seconds, message = _run(item)
        finally:
            os.environ.pop("HONOURED_MUTANT", None)
        reached = os.path.exists(hits) and entry in open(hits).read().split()
        if failed:
            _KILLED.add(entry)
        _record(entry=entry, test=item.nodeid, failed=failed, skipped=skipped, seconds=seconds, reached=reached,
                message=message)
    return True
