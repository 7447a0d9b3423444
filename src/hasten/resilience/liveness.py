"""Whether a rank that stopped answering the hang doctor is frozen, gone or busy, and where it was last seen.

A rank whose process is stopped (SIGSTOP, a debugger, a node that hangs without dying) answers nothing: its
watchdog thread does not run. So every rank posts who it is (host and pid) once, and its status again every
`HEARTBEAT` seconds; the rank that reports a timeout reads both for each rank that did not answer. On the same
machine it can look at the process itself (/proc): stopped, gone, or running (then stuck in C code that holds the
GIL). A stopped process does not handle the SIGTERM the launcher's agent sends it (the agent waits 30 s and then
kills it), so once the report is published the reporting rank sends it SIGCONT: its watchdog then sees the report
and ends it like every other rank.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time

from .hang_report import state_words

HEARTBEAT = 1.0  # seconds between two posts of a rank's status, so that a frozen rank leaves where it was


def identity() -> str:
    return json.dumps({"host": socket.gethostname(), "pid": os.getpid()})


def post_identity(store, rank: int) -> None:
    store.set(f"p/{rank}", identity())


def _read(store, key: str):
    try:
        return json.loads(store.get(key)) if store.check([key]) else None
    except Exception:  # noqa: BLE001 - a report must not fail for want of a detail
        return None


def process_state(ident) -> str | None:
    """'stopped', 'gone' or 'running' for a process on this machine; None for another machine's (or unknown)."""
    if not ident or ident.get("host") != socket.gethostname():
        return None
    try:
        with open(f"/proc/{int(ident['pid'])}/stat") as handle:
            state = handle.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError, ValueError):
        return "gone"
    return {"T": "stopped", "t": "stopped", "Z": "gone", "X": "gone"}.get(state, "running")


def look(store, rank: int) -> tuple:
    """(words for the report's headline, the identity to wake or None) for a rank that did not answer."""
    ident, last = _read(store, f"p/{rank}"), _read(store, f"s/{rank}")
    state = process_state(ident)
    where = ""
    if last is not None:
        top = last["stack"][-1] if last.get("stack") else "unknown code"
        where = f"; last seen {time.time() - last['time']:.0f}s ago {state_words(last)} at {top}"
    if state == "stopped":
        return (f"rank {rank} stopped answering: its process (pid {ident['pid']} on this machine) is stopped, alive "
                f"but not running (SIGSTOP, a debugger, or a frozen node){where}"), ident
    if state == "gone":
        return f"rank {rank} stopped answering: its process (pid {ident['pid']} on this machine) is gone{where}", None
    if state == "running":
        return (f"rank {rank} stopped answering: its process (pid {ident['pid']}) runs, but its Python does not "
                f"(stuck in C code that holds the GIL){where}"), None
    host = f" on {ident['host']}" if ident else ""
    return (f"rank {rank} stopped answering (its process{host} is frozen, gone, or stuck in C code that holds the "
            f"GIL){where}"), None


def wake(ident) -> None:
    """SIGCONT a stopped process on this machine, so that its watchdog obeys the published report."""
    try:
        os.kill(int(ident["pid"]), signal.SIGCONT)
    except (OSError, KeyError, TypeError, ValueError):
        pass


def after_timeout(store, rank: int, world_size: int, error) -> str | None:
    """A collective the doctor does not see (DDP's gradient all-reduce, made in C++) timed out on `rank` and ends its
    process: name the ranks that stopped answering (a frozen one is then woken, so that it ends too instead of
    ignoring the launcher's SIGTERM); None when `error` is no timeout or every other rank answers."""
    text = str(error).lower()
    if "timed out" not in text and "timeout" not in text:
        return None
    words = []
    for other in range(world_size):
        last = _read(store, f"s/{other}")
        if other == rank or (last is not None and time.time() - last["time"] < 3 * HEARTBEAT):
            continue  # it posted its status lately: it runs
        said, ident = look(store, other)
        words.append(said)
        if ident is not None:
            wake(ident)
    return "; ".join(words) or None
