"""Run the GPU suite's cases in the plan's order (scripts/gpu_plan.py), each inside its bound, the whole inside the
run's budget, writing each result as the case ends; then print the pass/fail table and the figures.

    python3 scripts/gpu_run.py --out DIR [--cases ID ...]   # gpu_check.sh calls it after installing the wheels

One pytest process runs the cases in order (plugin scripts/gpu_results.py appends a line to DIR/results.jsonl as
each starts and ends). A case still running past its bound is stopped (its pytest and every process under it), is
recorded as a timeout, and pytest is started again for the cases after it; at the run's budget the case running
is recorded as stopped and the rest as not run. So a stuck case costs its bound, and whatever happens, the results
reached so far are on disk. Exit status: 0 when every case passed or skipped, 1 otherwise.
Standard library only (the GPU machine's python3 has pytest; nothing here needs torch).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_plan  # noqa: E402

POLL = 0.5


def _events(path: Path) -> list[dict]:
    if not path.exists():
        return []
    events = []
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:  # a line cut short by a kill
            continue
    return events


def _append(path: Path, record: dict) -> None:
    with open(path, "a") as handle:
        handle.write(json.dumps(record) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def _descendants(root: int) -> list[int]:
    """Every process below `root` (Linux /proc): torchrun starts each worker in a session of its own, out of reach of
    a kill of pytest's process group, and a stuck worker left behind would hold the GPU for the cases after it."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry.name))
    found, stack = [], [root]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def _stop(process: subprocess.Popen) -> None:
    """End pytest and everything it started: its process group (launchers, torchrun) and every descendant."""
    if process.poll() is None:
        below = _descendants(process.pid)  # before the kill: orphans lose their place in the tree
        for pid in below:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    process.wait()


def _state(events: list[dict]) -> tuple[set, dict]:
    """(the cases that ended, {case: start time} of those started and not ended)."""
    ended = {e["case"] for e in events if e.get("event") == "end"}
    running = {e["case"]: e["at"] for e in events if e.get("event") == "start" and e["case"] not in ended}
    return ended, running


def run(cases: list, out: Path, python: str = sys.executable, budget: float = gpu_plan.RUN_BUDGET,
        cwd: Path = gpu_plan.REPO, extra: tuple = ()) -> Path:
    """Run `cases` (gpu_plan.Case) in order; returns the results file (one JSON line per start and end)."""
    out.mkdir(parents=True, exist_ok=True)
    results = out / "results.jsonl"
    bounds = {case.node: case.bound for case in cases}
    deadline = time.monotonic() + budget
    env = dict(os.environ, HASTEN_GPU_RESULTS=str(results), PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(__file__).resolve().parent), env.get("PYTHONPATH")) if p)
    remaining = [case.node for case in cases]
    while remaining:
        if deadline - time.monotonic() < gpu_plan.STARTUP:
            for node in remaining:
                _append(results, {"case": node, "event": "end", "outcome": "not run",
                                  "message": f"the run's {budget:.0f} s budget was spent", "seconds": 0})
            break
        with open(out / "pytest.log", "a") as log:
            process = subprocess.Popen([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "gpu_results",
                                        "-rA", "-s", *extra, *remaining], cwd=cwd, env=env, stdout=log,
                                       stderr=subprocess.STDOUT, start_new_session=True)
            while process.poll() is None:
                time.sleep(POLL)
                _, running = _state(_events(results))
                now_wall, now = time.time(), time.monotonic()
                late = [(node, started) for node, started in running.items()
                        if now_wall - started > bounds.get(node, gpu_plan.BOUND)]
                if late or now > deadline:
                    _stop(process)
                    for node, started in running.items():
                        why = (f"stopped at its {bounds.get(node, gpu_plan.BOUND)} s bound" if late
                               else f"stopped at the run's {budget:.0f} s budget")
                        _append(results, {"case": node, "event": "end", "outcome": "timeout", "message": why,
                                          "seconds": round(now_wall - started, 1)})
                    break
        ended, running = _state(_events(results))
        if time.monotonic() > deadline:
            remaining = [node for node in remaining if node not in ended]
            continue  # the top of the loop records the rest as not run
        for node in running:  # pytest itself died inside a case (a crash, os._exit)
            _append(results, {"case": node, "event": "end", "outcome": "failed", "seconds": 0,
                              "message": f"pytest exited with status {process.returncode} during this case"})
            ended.add(node)
        left = [node for node in remaining if node not in ended]
        if len(left) == len(remaining):  # nothing moved: pytest cannot start (a collection error): say it, stop
            for node in left:
                _append(results, {"case": node, "event": "end", "outcome": "not run", "seconds": 0,
                                  "message": f"pytest exited with status {process.returncode} before it (pytest.log)"})
            break
        remaining = left
    return results


def outcomes(results: Path) -> dict:
    """{case: (outcome, seconds, message)}: a case's worst end (a failing teardown after a passing call)."""
    rank = {"passed": 0, "skipped": 1, "not run": 2, "failed": 3, "timeout": 4}
    table: dict = {}
    for event in _events(results):
        if event.get("event") != "end":
            continue
        row = (event["outcome"], event.get("seconds", 0), event.get("message", ""))
        old = table.get(event["case"])
        if old is None or rank.get(row[0], 3) > rank.get(old[0], 3):
            table[event["case"]] = row
    return table


def print_table(results: Path, figures: Path | None) -> int:
    table = outcomes(results)
    words = {"passed": "PASS", "failed": "FAIL", "skipped": "skip", "timeout": "TIMEOUT", "not run": "not run"}
    print("\n| test | result | time (s) |\n| --- | --- | --- |")
    for case, (outcome, seconds, message) in table.items():
        detail = f": {message[:100]}" if message and outcome != "passed" else ""
        print(f"| {case.split('::', 1)[-1]} | {words.get(outcome, outcome)}{detail} | {float(seconds):.1f} |")
    if figures is not None and figures.exists():
        rows = [json.loads(line) for line in figures.read_text().splitlines() if line.strip()]
        if rows:
            print("\n| figure | value | detail |\n| --- | --- | --- |")
            for f in rows:
                print(f"| {f['name']} | {f['value']} {f['unit']} | {f['note']} |")
    failed = [case for case, (outcome, _, _) in table.items() if outcome not in ("passed", "skipped")]
    if failed:
        print("\nrerun the failed cases: bash scripts/gpu_check.sh --cases " + " ".join(f"'{c}'" for c in failed))
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--cases", nargs="*", help="run only these planned node ids (a rerun)")
    parser.add_argument("--budget", type=float, default=gpu_plan.RUN_BUDGET)
    args = parser.parse_args()
    out = Path(args.out)
    results = run(gpu_plan.selected(args.cases), out, budget=args.budget)
    return print_table(results, Path(os.environ["HASTEN_GPU_FIGURES"]) if "HASTEN_GPU_FIGURES" in os.environ else None)


if __name__ == "__main__":
    sys.exit(main())
