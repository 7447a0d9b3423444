"""The hang doctor's fingerprints and report: what a collective is called with, who called what at one
collective, and where each rank is (pure functions).

`hasten.resilience.hang_doctor` gathers each rank's status (a dict posted on the store: its state, the collective it
waits in as `entry`, its last collectives as `history`, its Python stack) and builds the report from them
here. An entry or history item is `[group, seq, name, detail, site, since]`.
"""

from __future__ import annotations

import time

TERMINAL = ("exited", "raised")


# The main thread only takes what a fingerprint needs (dtype objects, shapes, ops: no tensor is kept); `render`
# turns it into text later, on the checker thread or for a report.
_TENSOR, _OP = "tensor", "op"
_DTYPE_NAMES: dict = {}


def _tensor(value, full: bool = True):
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is None or dtype is None:
        return "?"
    return (_TENSOR, dtype, shape, full)


def _first(values) -> str:
    values = list(values or [])
    return f"{len(values)}x{render((_tensor(values[0], full=False),))}" if values else "0"


def _op(value):
    return "SUM" if value is None else (_OP, value)


def _root(bound, name: str, group_name: str):
    value = bound.get(name)
    return value if value is not None else bound.get(group_name, 0)


def _text(part) -> str:
    if isinstance(part, str):
        return part
    if isinstance(part, tuple) and part and part[0] == _TENSOR:
        _, dtype, shape, full = part
        name = _DTYPE_NAMES.get(dtype)
        if name is None:
            name = _DTYPE_NAMES[dtype] = str(dtype).replace("torch.", "")
        return f"{name}{list(shape)}" if full else f"{name}/{len(shape)}d"
    if isinstance(part, tuple) and part and part[0] == _OP:
        return str(getattr(part[1], "name", part[1])).rpartition(".")[2]
    return str(part)


def render(raw) -> str:
    """The text of a fingerprint's detail from what a describer took (a string is already text)."""
    return raw if isinstance(raw, str) else "".join(_text(part) for part in raw)


# name -> what of its arguments must agree across ranks. Shapes are compared in full where every backend
# needs them equal; only dtype and rank of a tensor where uneven sizes are allowed (lists, all_to_all).
DESCRIBE = {
    "all_reduce": lambda a: (_tensor(a.get("tensor")), " op=", _op(a.get("op"))),
    "broadcast": lambda a: (_tensor(a.get("tensor")), " src=", _root(a, "src", "group_src")),
    "reduce": lambda a: (_tensor(a.get("tensor")), " dst=", _root(a, "dst", "group_dst"), " op=", _op(a.get("op"))),
    "all_gather": lambda a: (_tensor(a.get("tensor"), full=False),),
    "all_gather_into_tensor": lambda a: (_tensor(a.get("input_tensor")), "->", _tensor(a.get("output_tensor"))),
    "reduce_scatter": lambda a: (_tensor(a.get("output")), " op=", _op(a.get("op"))),
    "reduce_scatter_tensor": lambda a: (_tensor(a.get("input")), "->", _tensor(a.get("output")), " op=",
                                        _op(a.get("op"))),
    "all_to_all": lambda a: _first(a.get("input_tensor_list")),
    "all_to_all_single": lambda a: (_tensor(a.get("input"), full=False),),
    "gather": lambda a: (_tensor(a.get("tensor"), full=False), " dst=", _root(a, "dst", "group_dst")),
    "scatter": lambda a: (_tensor(a.get("tensor"), full=False), " src=", _root(a, "src", "group_src")),
    "barrier": lambda a: "",
    "monitored_barrier": lambda a: "",
    "all_gather_object": lambda a: "",
    "gather_object": lambda a: ("dst=", _root(a, "dst", "group_dst")),
    "broadcast_object_list": lambda a: (len(a.get("object_list") or []), " objects src=",
                                        _root(a, "src", "group_src")),
    "scatter_object_list": lambda a: ("src=", _root(a, "src", "group_src")),
}


def shown(name: str, detail: str) -> str:
    return f"{name}({detail})"


def at(status, group: str, seq: int) -> bool:
    """Whether the rank of `status` waits in collective #seq of `group`."""
    here = (status or {}).get("entry")
    return bool(here) and here[0] == group and here[1] == seq


def passed(status, group: str, seq: int):
    """The history item of collective #seq of `group` when the rank of `status` has issued it, else None."""
    for item in (status or {}).get("history", ()):
        if item[0] == group and item[1] == seq:
            return item
    return None


def calls_at(statuses: dict, group: str, seq: int) -> dict:
    """{rank: (name, detail, site)} of every rank whose status shows what it called at collective #seq."""
    calls = {}
    for rank, status in statuses.items():
        item = status.get("entry") if at(status, group, seq) else passed(status, group, seq)
        if item:
            calls[rank] = (item[2], item[3], item[4])
    return calls


def odd_ones(calls: dict) -> list:
    """The ranks whose call differs from the most common one; in a tie, from the lowest rank's call."""
    counts = {}
    for call in calls.values():
        counts[call[:2]] = counts.get(call[:2], 0) + 1
    lowest = calls[min(calls)][:2]
    common = max(counts, key=lambda c: (counts[c], c == lowest))
    return sorted(rank for rank, call in calls.items() if call[:2] != common) or sorted(calls)[-1:]


def divergence_headline(calls: dict, group: str, seq: int) -> tuple:
    """(headline, diverging ranks) for ranks that called different collectives at #seq of `group`."""
    diverging = odd_ones(calls)
    reference = next(rank for rank in sorted(calls) if rank not in diverging)
    name, detail, site = calls[diverging[0]]
    others = [f"rank {rank} calls {shown(c[0], c[1])} at {c[2]}" for rank, c in sorted(calls.items())
              if rank not in diverging]
    headline = (f"rank {diverging[0]} diverged at collective #{seq} of the {group} group: it calls "
                f"{shown(name, detail)} at {site} while {', '.join(others)}")
    if calls[reference][0] == name:
        headline += " (same collective, different tensors)"
    return headline, diverging


def state_words(status) -> str:
    state = status["state"]
    if state == "collective":
        entry = status["entry"]
        return f"waiting in {shown(entry[2], entry[3])} (collective #{entry[1]} of the {entry[0]} group)"
    if state == "raised":
        return f"gone: it raised {status['error']}"
    if state == "exited":
        return "gone: it returned from its script"
    return "running Python code"


def left_headline(rank: int, status: dict, me: int, entry) -> str:
    """The headline of a report on `rank`, which left (returned or raised) before the collective `entry` that
    rank `me` waits in."""
    if status["state"] == "raised":
        what = f"raised {status['error']}"
    else:
        last = status["history"][-1] if status["history"] else None
        what = "returned from its script" + (f" (its last collective: #{last[1]} {shown(last[2], last[3])} at "
                                             f"{last[4]})" if last else " (before any collective)")
    return (f"rank {rank} {what} while rank {me} waits in {shown(entry.name, entry.detail)} at "
            f"{entry.site} (collective #{entry.seq} of the {entry.group} group, which rank {rank} never reached)")


def timeout_headline(entry, missing: list, statuses: dict, me: int, timeout: float, silent=None) -> str:
    """The headline of a report on the collective `entry` that rank `me` waited in past `timeout` seconds, for
    which the ranks `missing` never arrived (`statuses`: those that answered; `silent`: {rank: words} on those
    that did not, from `liveness.look`)."""
    waited = time.time() - entry.since
    where = []
    for rank in missing:
        status = statuses.get(rank)
        if status is None:
            where.append((silent or {}).get(rank) or f"rank {rank} did not answer")
        else:
            top = status["stack"][-1] if status["stack"] else "unknown code"
            where.append(f"rank {rank} never arrived (it is {state_words(status)} at {top})")
    queued = (" (its call returned, but the backend never completed it: queued on the device or async_op)"
              if entry.queued else "")
    return (f"{shown(entry.name, entry.detail)} at {entry.site} timed out on rank {me} after "
            f"{waited:.0f}s{queued} (the collective timeout is {timeout:g}s): " + "; ".join(where or
            ["every rank is in it: the collective itself is stuck (network, device)"]))


def _where(status, collective) -> str:
    """Where a rank is; for a divergence report, also whether it waits in the diverged collective or passed it."""
    if collective is None:
        return state_words(status)
    group, seq = collective
    if at(status, group, seq):
        return state_words(status)
    item = passed(status, group, seq)
    if item is None:
        return state_words(status)
    # gloo may complete a mismatched pair (same sizes), and the checker thread runs behind the main thread
    return (f"passed {shown(item[2], item[3])} at {item[4]} (collective #{seq} of the {group} group); now "
            f"{state_words(status)}")


FIXES = {
    "diverged": "every rank must call the same collectives in the same order, with the same shapes and dtypes.",
    "left": "a rank that returns, raises or exits early leaves the others waiting: every rank must reach the same "
            "collectives (catch the error on every rank, or end all ranks together).",
    "timeout": "the rank that never arrived is busy where its stack shows; if that work is legitimately long, raise "
               "the timeout (InitProcessGroupKwargs(timeout=...) or HASTEN_COLLECTIVE_TIMEOUT, in seconds).",
}


def format_report(headline: str, statuses: dict, world_size: int, kind: str = "diverged", collective=None) -> str:
    """The report: the headline, each rank's state and Python stack, and the fix. `collective`: (group, seq)."""
    lines = ["=" * 30 + " hasten hang doctor " + "=" * 30, headline, "Where each rank is (innermost call last):"]
    for rank in range(world_size):
        status = statuses.get(rank)
        if status is None:
            lines.append(f"  rank {rank}: did not answer within the wait (its process may be gone, or stuck in C "
                         "code that holds the GIL)")
            continue
        lines.append(f"  rank {rank}: {_where(status, collective)}")
        lines.extend(f"      {line}" for line in status.get("stack", []))
    lines.append(f"Fix: {FIXES[kind]} (Debug mode is on: HASTEN_DEBUG_MODE=0 turns the doctor off.)")
    lines.append("=" * 80)
    return "\n".join(lines)
