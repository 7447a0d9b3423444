"""Prove the acceptance matrix with mutants: each entry's mutant drops what the user gave, and one of the entry's
mapped tests must fail (docs/honoured.md).

    python scripts/prove_honoured.py                      # every entry (long: run it in chunks, in the background)
    python scripts/prove_honoured.py setting:tee param:prepare:device_placement
    python scripts/prove_honoured.py --sample 40 --seed 2026-11-27   # CI's rotating sample
    python scripts/prove_honoured.py --chunk 3/8 --json out.json   # the third of eight slices

Entries and the map come from tests/acceptance_entries.py and tests/acceptance_map.py. The mutants are
scripts/honoured_hook.py, installed as `sitecustomize` in every process of the run (the test process, `hasten
launch` and its workers); the pytest side is scripts/honoured_plugin.py. Each mapped test runs once as it is (its
baseline) and once per entry with that entry's mutant live. An entry is

    killed        a mapped test failed with the mutant (the test named is the first that did)
    survived      every mapped test passed with the mutant, which did change a call
    not reached   every mapped test passed, and the mutant never saw the value given (the test does not give it)
    baseline      a mapped test fails or skips without any mutant: nothing can be concluded
    no target     the entry has no point the tool can patch (said why)
    not run       the run ended (time limit) before the entry's turn

Exit status 1 when an entry is not killed.

`--kind` chooses the mutants (scripts/honoured_hook.py says each in full):

    drop       (the default) the value given is dropped, as if the user had not given it
    default    the value given is replaced by the default (the settings row's, the signature's or dataclass's, or
               the one the code computes), its source kept; run alone it takes the settings rows (for a parameter
               or field it differs from `drop` only where the code tells "passed its default" from "not passed":
               name those entries to run them)
    spelling   one mutant per accepted variable of a settings row with several (`setting:log_level~ACCELERATE_LOG_LEVEL`
               hides ACCELERATE_LOG_LEVEL alone); run alone it takes every such row. A spelling's tests are its
               row's MAP line and tests/acceptance_map.py's SPELLING_TESTS.

    python scripts/prove_honoured.py --kind spelling setting:log_level
    python scripts/prove_honoured.py --kind default --json default.json

With --table, the drop kind writes the whole of docs/honoured.md (keeping the other kinds' sections at its end);
another kind writes or replaces its own section at the end.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import hashlib
import importlib
import inspect
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
sys.path.insert(0, str(TESTS))

import acceptance_entries  # noqa: E402
import acceptance_map  # noqa: E402


KINDS = ("drop", "default", "spelling")


def target(entry: str) -> list:
    """[kind, module the mutant waits for, attribute path, parameter] of an entry (see honoured_hook); a spelling
    mutant `setting:<name>~<VARIABLE>` adds the variable."""
    entry, _, variable = entry.partition("~")
    kind, _, rest = entry.partition(":")
    if variable:
        from hasten.config.settings import BY_NAME

        if kind != "setting" or variable not in BY_NAME[rest].env:
            raise LookupError(f"{variable} is not a variable of {entry}")
        return ["spelling", "hasten.config.resolve", "_from_env", rest, variable]
    if kind == "setting":
        from hasten.config.settings import BY_NAME

        dests = [flag.lstrip("-").replace("-", "_") for flag in BY_NAME[rest].flags if flag.startswith("--")]
        return ["setting", "hasten.config.resolve", "resolve", rest, *dests]
    if kind == "param":
        label, _, parameter = rest.partition(":")
        module, cls, name = acceptance_entries.CALLABLES[label]
        owner = importlib.import_module(module)
        if cls:
            klass = next(k for k in getattr(owner, cls).__mro__ if name in vars(k))
            return ["param", klass.__module__, f"{klass.__qualname__}.{name}", parameter]
        function = inspect.unwrap(getattr(owner, name))
        return ["param", function.__module__, function.__name__, parameter]
    label, _, parameter = rest.partition(":")
    cls = getattr(importlib.import_module(acceptance_entries.DATACLASS_MODULE), label)
    if parameter not in inspect.signature(cls.__init__).parameters:
        raise LookupError(f"{label}.{parameter} is not an __init__ parameter")
    return ["field", cls.__module__, cls.__qualname__, parameter]


def mapped_tests(entry: str) -> list:
    """The tests of an entry (its MAP line); a spelling mutant's also include SPELLING_TESTS."""
    base, spelling, _ = entry.partition("~")
    tests = acceptance_map.MAP[base]
    tests = [tests] if isinstance(tests, str) else list(tests)
    return tests + [t for t in acceptance_map.SPELLING_TESTS if t not in tests] if spelling else tests


def mutants(entries: list, kind: str, named: bool) -> list:
    """The mutants of a kind for the entries: a spelling mutant per variable of each row with several (a named
    spelling mutant stays itself); the default kind takes the settings rows unless entries were `named`."""
    if kind == "drop":
        return entries
    if kind == "default":
        return entries if named else [e for e in entries if e.startswith("setting:")]
    from hasten.config.settings import BY_NAME

    result = []
    for entry in entries:
        name = entry.partition(":")[2]
        if "~" in entry:
            result.append(entry)
        elif entry.startswith("setting:") and len(BY_NAME[name].env) > 1:
            result += [f"{entry}~{variable}" for variable in BY_NAME[name].env]
    return result


def rotating_sample(entries: list, size: int, seed: str, budget: float | None = None, seconds: dict | None = None):
    """`size` entries in an order fixed by `seed` (CI passes the date, so the sample turns over day by day). With
    a `budget` (seconds) and the last full run's `seconds` per entry, entries that would overrun it are passed
    over for later ones, so the sample keeps to the budget; at least `size` entries whenever the table allows."""
    order = sorted(entries, key=lambda e: hashlib.sha256(f"{seed}:{e}".encode()).hexdigest())
    if budget is None or not seconds:
        return order[:size]
    chosen, spent = [], 0.0
    for entry in order:
        cost = seconds.get(entry, budget / size)
        if spent + cost <= budget:
            chosen.append(entry)
            spent += cost
        if len(chosen) == size:
            break
    return chosen


def recorded_seconds(path) -> dict:
    """{entry: seconds its mutant took} from a table written by --table (docs/honoured.md) or from --json output."""
    if not path or not Path(path).is_file():
        return {}
    text = Path(path).read_text()
    if path.endswith(".json"):
        return {entry: row["seconds"] for entry, row in json.loads(text).items()}
    seconds = {}
    for line in text.partition(SECTION_MARK)[0].splitlines():  # the drop kind's table only
        cells = [cell.strip().strip("`") for cell in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and ":" in cells[0] and cells[2].replace(".", "", 1).isdigit():
            seconds[cells[0]] = float(cells[2])
    return seconds


def run(entries: list, *, timeout: float = 3000, verbose: bool = True, baseline: bool = True, kind: str = "drop") -> dict:
    """{entry: {"status", "test", "seconds", "message"}} for the given entries."""
    results, targets = {}, {}
    for entry in entries:
        try:
            targets[entry] = target(entry)
        except (LookupError, AttributeError, TypeError, ValueError) as error:
            results[entry] = {"status": "no target", "test": "", "seconds": 0.0, "message": str(error)}
    plan: dict = {}
    for entry in targets:
        for test in mapped_tests(entry):
            plan.setdefault(test, []).append(entry)
    if not plan:
        return results
    scratch = Path(tempfile.mkdtemp(prefix="honoured-"))
    try:
        shutil.copy(ROOT / "scripts" / "honoured_hook.py", scratch / "sitecustomize.py")
        shutil.copy(ROOT / "scripts" / "honoured_plugin.py", scratch / "honoured_plugin.py")
        report = scratch / "report.jsonl"
        env = {k: v for k, v in os.environ.items() if not k.startswith("HONOURED_")}
        env.update(HONOURED_TARGETS=json.dumps(targets), HONOURED_PLAN=json.dumps(plan),
                   HONOURED_REPORT=str(report), HONOURED_HITS=str(scratch / "hits"),
                   HONOURED_BASELINE="1" if baseline else "0", HONOURED_KIND=kind,
                   PYTHONPATH=os.pathsep.join(p for p in (str(scratch), env.get("PYTHONPATH", "")) if p))
        selection = sorted(plan)
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "honoured_plugin",
                   "--no-header", "-rN", *selection]
        started = time.monotonic()
        try:
            done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
            tail = (done.stdout + done.stderr)[-2000:]
        except subprocess.TimeoutExpired:
            tail = f"timed out after {timeout:.0f} s"
        if verbose:
            print(f"pytest over {len(selection)} test(s) for {len(targets)} mutant(s): {time.monotonic() - started:.0f} s",
                  file=sys.stderr)
        rows = [json.loads(line) for line in report.read_text().splitlines()] if report.exists() else []
        if not rows and "timed out" not in tail:
            raise SystemExit(f"the mutation run produced no report:\n{tail}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    baseline_bad = {row["test"].split("[", 1)[0]: row for row in rows if row["entry"] is None
                    and (row["failed"] or row["skipped"])}
    by_entry: dict = {}
    for row in rows:
        if row["entry"] is not None:
            by_entry.setdefault(row["entry"], []).append(row)
    for entry in targets:
        runs = by_entry.get(entry, [])
        seconds = sum(r["seconds"] for r in runs)
        killed = next((r for r in runs if r["failed"]), None)
        bad = [t for t in mapped_tests(entry) if t in baseline_bad]
        if killed:
            results[entry] = {"status": "killed", "test": killed["test"], "seconds": seconds,
                              "message": killed["message"]}
        elif bad and not runs:
            row = baseline_bad[bad[0]]
            results[entry] = {"status": "baseline", "test": row["test"], "seconds": seconds,
                              "message": ("skipped" if row["skipped"] else "fails") + ": " + row["message"]}
        elif not runs:
            results[entry] = {"status": "not run", "test": ", ".join(mapped_tests(entry)), "seconds": 0.0,
                              "message": tail.splitlines()[-1] if tail.strip() else "pytest collected no such test"}
        else:
            reached = any(r.get("reached") for r in runs)
            results[entry] = {"status": "survived" if reached else "not reached",
                              "test": ", ".join(mapped_tests(entry)), "seconds": seconds, "message": ""}
    return results


SECTION_MARK = "<!-- mutants: "  # opens another kind's section, after the drop kind's table


def _commit() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip() or "unknown"


def _counts(results: dict) -> dict:
    counts: dict = {}
    for row in results.values():
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    return counts


def write_section(path: str, results: dict, kind: str, note: str = "") -> None:
    """Another kind's run as a section at the end of docs/honoured.md, replacing that kind's earlier section."""
    text = Path(path).read_text() if Path(path).is_file() else ""
    start, end = f"{SECTION_MARK}{kind} -->", f"<!-- /mutants: {kind} -->"
    head, found, rest = text.partition(start)
    tail = rest.partition(end)[2] if found else ""
    order = acceptance_entries.all_entries()
    rows = sorted(results.items(), key=lambda item: (order.index(item[0].partition("~")[0])
                                                    if item[0].partition("~")[0] in order else len(order), item[0]))
    counts = _counts(results)
    lines = [start, "", f"## The `{kind}` mutants (`--kind {kind}`)", "",
             f"Run of {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC on commit {_commit()}, "
             "2 shared CPU cores.", "",
             f"**{len(results)} mutants: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) + ".**"]
    if note:
        lines += ["", note]
    lines += ["", "| mutant | status | seconds | test that killed it (or the mapped tests) |", "| --- | --- | --- | --- |"]
    lines += [f"| `{entry}` | {row['status']} | {row['seconds']:.1f} | {row['test']} |" for entry, row in rows]
    lines += ["", end]
    Path(path).write_text(head.rstrip("\n") + "\n\n" + "\n".join(lines) + "\n" + tail.lstrip("\n"))


def write_table(path: str, results: dict, note: str = "") -> None:
    """docs/honoured.md: the date, commit, totals and slowest entries of a run, and its whole table (the other
    kinds' sections at the end of the file are kept)."""
    commit = _commit()
    counts = _counts(results)
    order = acceptance_entries.all_entries()
    rows = sorted(results.items(), key=lambda item: order.index(item[0]) if item[0] in order else len(order))
    slowest = sorted(results.items(), key=lambda item: -item[1]["seconds"])[:10]
    lines = [
        "# Accepted means honoured: the mutation run",
        "",
        "Each entry of the acceptance matrix (tests/acceptance_entries.py: Accelerate's parameters, dataclass fields and",
        "hasten's settings rows) is dropped by a mutant and its mapped tests (tests/acceptance_map.py) must fail:",
        "`python scripts/prove_honoured.py` (see its docstring for the mutants and the statuses). CI runs a rotating",
        "sample (tests/test_honoured_sample.py) that reads the seconds below to keep to its budget. Two other kinds of",
        "mutant, the value replaced by its default (`--kind default`) and one variable name of several hidden alone",
        "(`--kind spelling`), have their own sections at the end.",
        "",
        f"Run of {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC on commit {commit}, 2 shared CPU cores.",
        "",
        f"**{len(results)} entries: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) + ".**",
    ]
    if note:
        lines += ["", note]
    lines += ["", "Slowest entries (seconds of the mutant's runs, baseline not counted):", ""]
    lines += [f"- `{entry}`: {row['seconds']:.1f} s ({row['test'].split('[', 1)[0]})" for entry, row in slowest]
    lines += ["", "| entry | status | seconds | test that killed it (or the mapped tests) |", "| --- | --- | --- | --- |"]
    for entry, row in rows:
        label = " (CPU part)" if entry in acceptance_map.CPU_PART else ""
        lines.append(f"| `{entry}`{label} | {row['status']} | {row['seconds']:.1f} | {row['test']} |")
    old = Path(path).read_text() if Path(path).is_file() else ""
    others = old[old.index(SECTION_MARK):] if SECTION_MARK in old else ""
    Path(path).write_text("\n".join(lines) + "\n" + ("\n" + others if others else ""))


def write_unproven(results: dict) -> None:
    """tests/acceptance_map.py's NOT_YET_PROVEN: every entry of a whole-table result that was not killed."""
    path = TESTS / "acceptance_map.py"
    text = path.read_text()
    head, marker, _ = text.partition("NOT_YET_PROVEN: list = [")
    if not marker:
        head, marker, _ = text.partition("NOT_YET_PROVEN: list = []")
    order = acceptance_entries.all_entries()
    unproven = [e for e in order if results.get(e, {}).get("status") != "killed"]
    body = "".join(f"    {entry!r},  # {results.get(entry, {}).get('status', 'not run')}\n" for entry in unproven)
    path.write_text(head + "NOT_YET_PROVEN: list = [\n" + body + "]\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("entries", nargs="*", help="entries to run (default: all of the matrix)")
    parser.add_argument("--sample", type=int, help="run a rotating sample of this many entries (of those not in "
                        "NOT_YET_PROVEN in tests/acceptance_map.py)")
    parser.add_argument("--seed", default=None, help="the sample's seed (default: today's date, UTC)")
    parser.add_argument("--budget", type=float, help="seconds the sample should keep to (needs --times)")
    parser.add_argument("--times", help="seconds per entry from the last full run, for --budget: docs/honoured.md "
                        "or a --json output")
    parser.add_argument("--chunk", help="i/n: run the i-th of n slices of the selection (1-based)")
    parser.add_argument("--json", help="write the results here as JSON")
    parser.add_argument("--timeout", type=float, default=3000, help="seconds for the whole pytest run")
    parser.add_argument("--table", help="write the results as docs/honoured.md's table here")
    parser.add_argument("--no-baseline", action="store_true", help="do not first run each test without a mutant "
                        "(the ordinary suite shows they pass)")
    parser.add_argument("--merge", nargs="+", help="instead of running, read these --json outputs (for --table)")
    parser.add_argument("--note", default="", help="a paragraph for the table's head")
    parser.add_argument("--kind", choices=KINDS, default="drop", help="which mutants: drop the value (default), "
                        "replace it by its default, or drop one spelling of a variable (see the docstring)")
    args = parser.parse_args(argv)
    entries = args.entries or acceptance_entries.all_entries()
    if args.kind != "drop":
        if args.sample:
            parser.error("--sample is the drop kind's (CI's rotating sample)")
        entries = mutants(entries, args.kind, named=bool(args.entries))
        if args.merge:
            results = {}
            for path in args.merge:
                results.update(json.loads(Path(path).read_text()))
            for entry in entries if not args.entries else []:  # the kind's whole selection: a mutant no run reached
                results.setdefault(entry, {"status": "not run", "test": ", ".join(mapped_tests(entry)),
                                           "seconds": 0.0, "message": ""})
            write_section(args.table, results, args.kind, args.note)
            return 0
    if args.merge:
        results = {}
        for path in args.merge:  # later files win: a re-run after a fix replaces the entry's earlier row
            results.update(json.loads(Path(path).read_text()))
        for entry in entries:  # the whole table: an entry no run reached says so
            results.setdefault(entry, {"status": "not run", "test": ", ".join(mapped_tests(entry)), "seconds": 0.0,
                                       "message": ""})
        write_table(args.table, results, args.note)
        write_unproven(results)
        return 0
    unknown = [e for e in entries if e.partition("~")[0] not in acceptance_map.MAP]
    if unknown:
        parser.error(f"entries with no line in tests/acceptance_map.py: {unknown[:5]}")
    if args.sample:
        seed = args.seed or datetime.datetime.now(datetime.timezone.utc).date().isoformat()
        proven = [e for e in entries if e not in acceptance_map.NOT_YET_PROVEN]
        entries = rotating_sample(proven, args.sample, seed, args.budget, recorded_seconds(args.times))
    if args.chunk:
        index, _, count = args.chunk.partition("/")
        entries = entries[int(index) - 1::int(count)]
    results = run(entries, timeout=args.timeout, baseline=not args.no_baseline, kind=args.kind)
    width = max((len(e) for e in results), default=10)
    for entry in entries:
        row = results[entry]
        print(f"{entry:<{width}}  {row['status']:<11}  {row['seconds']:6.1f}s  {row['test']}  {row['message']}".rstrip())
    counts = {}
    for row in results.values():
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    print(f"{len(results)} entries: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, sort_keys=True))
    if args.table:
        (write_table if args.kind == "drop" else functools.partial(write_section, kind=args.kind))(
            args.table, results, note=args.note)
    return 0 if all(row["status"] == "killed" for row in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
