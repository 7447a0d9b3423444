"""The hang doctor: in debug mode, ranks whose collectives diverge stop within seconds, with one report.

Switched on by debug mode (`hasten launch --debug`, `HASTEN_DEBUG_MODE=1` / `ACCELERATE_DEBUG_MODE=1`) in a
run of more than one process; `PartialState` installs it once the process group is up. Off, nothing here runs:
no wrapper is installed, no store is touched.

How it works:

- Every collective goes through `Doctor.run` once: hasten's own (`hasten.distributed.operations`, `wait_for_everyone`)
  and the user's `torch.distributed` calls, whose functions (`WRAPPED`) are replaced on `torch.distributed`
  and `torch.distributed.distributed_c10d` while the doctor is on. Collectives issued inside another one
  (hasten's `gather` calls `all_gather`) are not counted again.
- Its fingerprint is the name, the tensors' dtypes and shapes, the reduce op and the root rank; the call site
  (`file:line` of the first frame outside hasten, torch and contextlib) travels with it for the report.
- The main thread only numbers the collective (per process group), records it and queues it for this rank's
  checker thread (a deque append: no store call, no thread woken); the collective starts at once. Every
  `CHECK_EVERY` seconds (at once when a flush asks) the checker of the group's lowest rank, its reference,
  appends the new fingerprints to one key of the job's TCPStore per chunk of `_CHUNK` collectives; every other
  rank's checker reads that key and compares its own collectives with it, in order. So each rank makes at most
  one store request per group per pass, whatever the number of collectives: a per-collective round trip
  through torchrun's agent cost ~0.1-0.3 ms of latency, or, made by a thread, about as much CPU, which a small
  machine pays in step time. A checker whose call differs asks every rank where it is, publishes the report
  and ends its process; the other ranks' watchdogs obey the report. No rank ever waits for another on this
  path (the store client releases the GIL while it waits).
- So a diverging rank does enter its collective: it waits there (most mismatches never complete), or gloo
  raises (mismatched sizes), or gloo completes a mismatched pair of the same size (`all_reduce` against
  `broadcast`). In the last case a rank may run ahead a few statements (a fraction of a second) before the
  checker stops it; the report says which ranks "passed" the collective. A collective that raises first waits
  (up to the doctor's wait) for the checker to have checked it, and compares the ranks' calls itself, so a
  divergence is reported as one, not as a lost peer or a timeout; a rank leaving its script also lets its
  checker finish first (bounded by the same wait), so a mismatch in the last collective is caught.
- A watchdog thread per rank polls one store counter every `POLL` seconds. It answers "where are you?" with
  the main thread's Python stack, stops its process once a report is published, and publishes one itself
  when the main thread has waited in a collective past the collective timeout, or when another rank left
  (returned from its script, or raised) before reaching the collective this rank waits in.

The report is written to the worker's torchelastic error file; `hasten launch` prints it once, last. Under
another launcher the rank that wrote the report prints it.

Here: the path of every collective, the checker thread, installing and removing the wrappers. A `Doctor` is also
made of `hang_verdict.Verdicts` (statuses, the survey, the reports) and `hang_watchdog.Watchdog` (the watchdog
thread, how a rank leaves); `hang_report` words the report.
"""

from __future__ import annotations

import atexit
import functools
import os
import sys
import threading
import time
from collections import deque

from ..core.errors import HangDetectedError
from .call_sites import call_site, skip_prefixes
from . import liveness
from .completion import completion_marker, is_finished
from .hang_report import DESCRIBE, render
from .hang_verdict import LAUNCHER_VARIABLE, Verdicts
from .hang_watchdog import Watchdog

__all__ = ["HangDetectedError", "WRAPPED", "active", "call_site", "install", "uninstall", "watch"]

_SEP = "\x1f"
CHECK_EVERY = 0.05  # seconds between two passes of the checker thread (each pass: one store request per group)
_CHUNK = 64  # collectives per store key of a group's reference fingerprints
_KEEP_CHUNKS = 32  # chunks older than this many are deleted from the store (a long run does not grow it)
_MAX_PENDING = 1024  # collectives the checker may lag behind before the main thread waits for it
_END = "\x1e"  # ends one fingerprint in a chunk
_MISSING = "\x00"  # a value no chunk key holds
_DOCTOR = None


def active() -> bool:
    """Whether the doctor watches this process's collectives (debug mode in a distributed run)."""
    return _DOCTOR is not None


WRAPPED = tuple(DESCRIBE)  # the torch.distributed functions the doctor watches while it is on


# -- the doctor ----------------------------------------------------------------------------------------------

class _Entry:
    """One collective as this rank issued it; its detail is made text when first needed (off the main thread)."""

    __slots__ = ("group", "seq", "name", "raw", "text", "site", "since", "thread", "queued")

    def __init__(self, group, seq, name, raw, site):
        self.group, self.seq, self.name, self.raw, self.site = group, seq, name, raw, site
        self.text = raw if isinstance(raw, str) else None
        self.since = time.time()
        self.thread = threading.get_ident()
        self.queued = False  # the call returned, but the backend has not completed the collective yet

    @property
    def detail(self) -> str:
        text = self.text
        if text is None:
            text = self.text = render(self.raw)
        return text

    def as_list(self) -> list:
        return [self.group, self.seq, self.name, self.detail, self.site, self.since]


class Doctor(Verdicts, Watchdog):
    def __init__(self, store, watch_store, rank: int, world_size: int, timeout: float, wait: float,
                 check_store=None):
        self.store, self.watch_store = store, watch_store
        self.check_store = check_store if check_store is not None else store
        self.rank, self.world_size = rank, world_size
        self.timeout, self.wait = timeout, wait
        self.local = threading.local()
        self.lock = threading.Lock()  # sequence numbers and the `inside` table
        self.report_lock = threading.RLock()  # one report at a time in this process
        self.seqs: dict = {}
        self.checked_seqs: dict = {}  # group key -> the last collective number the checker has compared
        self.inside: dict = {}  # thread id -> _Entry of the collective it is in
        self.history = deque(maxlen=16)  # covers the few collectives a rank may run ahead of its checker
        self.main = threading.main_thread().ident
        self.state = "running"
        self.error = ""
        self.raising_since = None  # set when the main thread raises the published report
        self.checked = None  # (entry, ranks that left) already looked at by the watchdog
        self.to_wake: list = []  # stopped ranks on this machine to SIGCONT once a report is published
        self.stopped = threading.Event()
        self.broken = False
        self.group_names: dict = {}
        self.members: dict = {"default": list(range(world_size))}  # group key -> its global ranks
        self.cleaners = {"default"} if rank == 0 else set()  # groups whose old store keys this rank deletes
        self.cleaned: dict = {}
        self.unchecked: deque = deque()  # entries for the checker, in the order the main thread issued them
        self.wake = threading.Event()  # a flush wants the checker now
        self.progress = threading.Condition()  # notified after each pass of the checker
        # Collectives whose call returned before they completed (NCCL queues work on the GPU; async_op=True):
        # (entry, completion marker), oldest first. The main thread appends, any thread drops finished ones.
        self.queued: deque = deque()
        self.queued_lock = threading.Lock()
        self.thread = threading.Thread(target=self._watch, name="hasten-hang-doctor", daemon=True)
        self.checker = threading.Thread(target=self._check, name="hasten-hang-doctor-checker", daemon=True)

    def start(self) -> None:
        liveness.post_identity(self.store, self.rank)
        self.thread.start()
        self.checker.start()

    # -- the path of every collective --------------------------------------------------------------------------
    def run(self, name, detail, group, call, args, kwargs, site=None):
        local = self.local
        if getattr(local, "depth", 0) or self.broken:
            result = call(*args, **kwargs)
            outer = getattr(local, "outer", None)  # inside one of hasten's watched collectives
            if outer is not None and not self.broken:
                self.note_completion(outer, args, kwargs, result)
            return result
        entry = self.enter(name, detail, group, site or call_site(3))
        local.depth = 1
        try:
            result = call(*args, **kwargs)
            self.note_completion(entry, args, kwargs, result)
            return result
        except HangDetectedError:
            raise
        except Exception as error:
            self.after_error(entry, error)
            raise
        finally:
            local.depth = 0
            self.leave(entry)

    def enter(self, name, detail, group, site) -> _Entry:
        """Number and record the collective for the checker thread (no store call, no thread woken here).

        `detail`: its text, or what a `DESCRIBE` function took from the arguments (made text later)."""
        key = self._group_key(group)
        with self.lock:
            seq = self.seqs[key] = self.seqs.get(key, 0) + 1
            entry = _Entry(key, seq, name, detail, site)
            self.inside[entry.thread] = entry
            self.history.append(entry)
        self.unchecked.append(entry)
        if seq - self.checked_seqs.get(key, 0) > _MAX_PENDING and not self.flush(self.wait):
            # The reference rank's checker stopped posting (it lost the store): never slow the run down for it.
            self._give_up(f"fell {_MAX_PENDING} collectives behind in checking them (the group's lowest rank no "
                          "longer posts its own)")
        return entry

    def flush(self, timeout: float) -> bool:
        """Wait (at most `timeout` seconds) until the checker has checked every collective issued so far."""
        if self.broken or not self.checker.is_alive() or threading.current_thread() is self.checker:
            return True
        target = dict(self.seqs)
        checked = self.checked_seqs

        def done():
            return self.broken or all(checked.get(key, 0) >= seq for key, seq in target.items())

        with self.progress:
            self.wake.set()
            return self.progress.wait_for(done, timeout)

    # -- the checker thread -------------------------------------------------------------------------------------
    def _check(self) -> None:
        """Every CHECK_EVERY seconds (or when a flush asks), check the collectives issued since the last time."""
        store = self.check_store
        pending: dict = {}  # group key -> deque of entries not checked yet, in order
        cache: dict = {}  # group key -> (chunk, items) last read from the group's reference rank
        while not self.stopped.is_set() and not self.broken:
            self.wake.wait(CHECK_EVERY)
            self.wake.clear()
            unchecked = self.unchecked
            while unchecked:
                entry = unchecked.popleft()
                pending.setdefault(entry.group, deque()).append(entry)
            try:
                for key, entries in pending.items():
                    if entries and self._check_group(store, key, entries, cache):
                        return  # a divergence was reported
            except Exception as error:  # noqa: BLE001 - the doctor must never be the reason a run fails
                self._give_up(error)
            with self.progress:
                self.progress.notify_all()

    def _check_group(self, store, key, entries, cache) -> bool:
        """Post (the group's reference rank) or compare (every other rank) `entries`; True if one diverged.

        The reference rank (the group's lowest) appends its fingerprints to one store key per chunk of
        `_CHUNK` collectives; every other rank reads that key (one request covers all the collectives it
        checks this time) and compares its own calls in order. A rank whose call differs makes the report.
        """
        members = self.members.get(key) or [self.rank]
        reference = min(members)
        if reference == self.rank:
            while entries:
                chunk = (entries[0].seq - 1) // _CHUNK
                items = []
                while entries and (entries[0].seq - 1) // _CHUNK == chunk:
                    entry = entries.popleft()
                    items.append(f"{entry.seq}{_SEP}{entry.name}{_SEP}{entry.detail}{_SEP}{entry.site}{_END}")
                store.append(f"c/{key}/{chunk}", "".join(items))
                self.checked_seqs[key] = entry.seq
            return False
        while entries:
            entry = entries[0]
            chunk = (entry.seq - 1) // _CHUNK
            read = cache.get(key)
            if read is None or read[0] != chunk or entry.seq not in read[1]:
                # compare_set with a value the key never holds: its value, without blocking when it is missing
                raw = store.compare_set(f"c/{key}/{chunk}", _MISSING, _MISSING).decode()
                posted = {}
                for item in ([] if raw == _MISSING else raw.split(_END)[:-1]):
                    seq, name, detail, site = item.split(_SEP)
                    posted[int(seq)] = (name, detail, site)
                read = cache[key] = (chunk, posted)
                if entry.seq not in posted:
                    return False  # the reference rank has not posted it yet: next time
            name, detail, site = read[1][entry.seq]
            if name != entry.name or detail != entry.detail:
                with self.report_lock:
                    if self._published() is None:
                        self._report_divergence(entry, self.survey(store), {reference: (name, detail, site)})
                return True
            entries.popleft()
            self.checked_seqs[key] = entry.seq
        return False

    # -- collectives that complete after their call returned ----------------------------------------------------
    def note_completion(self, entry, args, kwargs, result) -> None:
        """Keep `entry` as unfinished until the backend completes it, when the call returned before that: NCCL
        only queues a collective on the GPU (a hang then blocks later, in `.item()` or a synchronize, outside any
        collective call), and `async_op=True` hands back a work object. Plain CPU collectives finish in the call."""
        marker = completion_marker(args, kwargs, result)
        if marker is None:
            return
        with self.queued_lock:
            self._drop_finished()
            self.queued.append((entry, marker))

    def _drop_finished(self) -> None:
        queued = self.queued
        while queued and is_finished(queued[0][1]):
            queued.popleft()

    def unfinished(self):
        """The oldest collective whose call returned but which the backend has not completed, or None."""
        with self.queued_lock:
            self._drop_finished()
            if not self.queued:
                return None
            entry = self.queued[0][0]
        entry.queued = True
        return entry

    def waiting_in(self):
        """The collective this rank waits for: the main thread's call, else the oldest unfinished one."""
        return self.inside.get(self.main) or self.unfinished()

    def leave(self, entry) -> None:
        # Only this thread writes its own key (no lock needed): clear it unless a nested entry replaced it.
        if self.inside.get(entry.thread) is entry:
            self.inside.pop(entry.thread, None)

    def _group_key(self, group) -> str:
        if group is None:
            return "default"
        key = self.group_names.get(id(group))
        if key is None:
            import torch.distributed as dist

            if group is dist.GroupMember.WORLD:
                key = "default"
            else:
                try:
                    key = "g" + dist.distributed_c10d._get_process_group_name(group)
                    members = dist.get_process_group_ranks(group)
                except Exception:  # noqa: BLE001 - a key no other rank shares: not compared
                    key, members = f"g{id(group)}", [self.rank]
                self.members[key] = members
                if min(members) == self.rank:
                    self.cleaners.add(key)
            self.group_names[id(group)] = key
        return key

    def _s(self):
        """This thread's store client (the main thread, the watchdog and the checker each have their own)."""
        current = threading.current_thread()
        if current is self.thread:
            return self.watch_store
        return self.check_store if current is self.checker else self.store

    def _give_up(self, error) -> None:
        if not self.broken:
            self.broken = True
            why = error if isinstance(error, str) else f"lost the store ({type(error).__name__}: {error})"
            print(f"hasten hang doctor: rank {self.rank} {why}; collectives are no longer checked", file=sys.stderr,
                  flush=True)

    def _clean(self, store) -> None:
        # The cleaner of a group is its reference rank; it follows what its checker posted. A chunk is deleted
        # long after every rank compared it (no checker lags more than _MAX_PENDING collectives behind).
        for key, seq in list(self.checked_seqs.items()):
            if key not in self.cleaners:
                continue
            done = self.cleaned.get(key, -1)
            for old in range(done + 1, (seq - 1) // _CHUNK - _KEEP_CHUNKS + 1):
                store.delete_key(f"c/{key}/{old}")
                self.cleaned[key] = old


# -- hasten's own collectives ---------------------------------------------------------------------------------

class _Watch:
    __slots__ = ("doctor", "entry", "outer")

    def __init__(self, doctor, name, detail, site):
        self.doctor = doctor
        self.outer = not getattr(doctor.local, "depth", 0) and not doctor.broken
        self.entry = doctor.enter(name, detail, None, site) if self.outer else None

    def __enter__(self):
        if self.outer:
            self.doctor.local.depth = 1
            self.doctor.local.outer = self.entry
        return self

    def __exit__(self, kind, value, tb):
        if not self.outer:
            return False
        self.doctor.local.depth = 0
        self.doctor.local.outer = None
        try:
            if value is not None and not isinstance(value, HangDetectedError) and isinstance(value, Exception) \
                    and not getattr(value, "hasten_consistent", False):
                self.doctor.after_error(self.entry, value)
        finally:
            self.doctor.leave(self.entry)
        return False


def watch(name: str, detail: str = ""):
    """Context manager around one of hasten's collectives (a no-op when the doctor is off)."""
    doctor = _DOCTOR
    if doctor is None:
        from contextlib import nullcontext

        return nullcontext()
    return _Watch(doctor, name, detail, call_site(3))


# -- install / uninstall --------------------------------------------------------------------------------------

def _wrapper(name, original, params):
    describe = DESCRIBE[name]

    @functools.wraps(original)
    def collective(*args, **kwargs):
        doctor = _DOCTOR
        if doctor is None:
            return original(*args, **kwargs)
        bound = dict(zip(params, args))
        bound.update(kwargs)
        group = bound.get("group")
        if group is not None and _is_non_member(group):
            return original(*args, **kwargs)
        try:
            detail = describe(bound)
        except Exception:  # noqa: BLE001 - odd arguments: torch will say what is wrong with them
            detail = "?"
        return doctor.run(name, detail, group, original, args, kwargs)

    collective._hasten_doctor = True
    return collective


def _is_non_member(group) -> bool:
    import torch.distributed as dist

    return group is dist.GroupMember.NON_GROUP_MEMBER


_ORIGINALS: dict = {}


def _doctor_stores():
    """Three clients of the job's store under a prefix of the doctor's own: one per thread (main, watchdog,
    checker), so that no thread waits behind another's round trip."""
    from datetime import timedelta

    import torch.distributed as dist

    base = dist.distributed_c10d._get_default_store()
    inner = base
    while isinstance(inner, dist.PrefixStore):
        inner = inner.underlying_store
    prefix = (f"hasten-doctor/{os.environ.get('TORCHELASTIC_RUN_ID', '')}/"
              f"{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/")
    if isinstance(inner, dist.TCPStore):
        clients = [dist.TCPStore(inner.host, inner.port, is_master=False, timeout=timedelta(seconds=30))
                   for _ in range(3)]
        return [dist.PrefixStore(prefix, client) for client in clients]
    return [dist.PrefixStore(prefix, base)] * 3


def install(timeout: float, wait: float) -> None:
    """Start watching this process's collectives (the process group must exist). Idempotent."""
    global _DOCTOR
    import inspect

    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    if _DOCTOR is not None or not dist.is_initialized() or dist.get_world_size() < 2:
        return
    skip_prefixes()  # computed once, before any collective needs it
    store, watch_store, check_store = _doctor_stores()
    doctor = Doctor(store, watch_store, dist.get_rank(), dist.get_world_size(), float(timeout), float(wait),
                    check_store)
    doctor._post(store, 0)
    for name in WRAPPED:
        original = getattr(c10d, name, None)
        if original is None or getattr(original, "_hasten_doctor", False):
            continue
        params = list(inspect.signature(original).parameters)
        wrapped = _wrapper(name, original, params)
        _ORIGINALS[name] = original
        for module in (c10d, dist):
            if getattr(module, name, None) is original:
                setattr(module, name, wrapped)
    _DOCTOR = doctor
    doctor.start()
    atexit.register(_at_exit)
    previous = sys.excepthook

    def excepthook(kind, value, tb):
        current = _DOCTOR
        if current is not None:
            current.on_uncaught(kind, value, tb)
        previous(kind, value, tb)
        report = getattr(value, "hasten_report", None)
        if report and getattr(value, "hasten_reporter", False) and not os.environ.get(LAUNCHER_VARIABLE):
            print(report, file=sys.stderr, flush=True)

    sys.excepthook = excepthook


def _at_exit() -> None:
    doctor = _DOCTOR
    if doctor is not None:
        doctor.on_exit()


def uninstall() -> None:
    """Put torch.distributed's own functions back and stop the doctor's threads (tests; a destroyed group)."""
    global _DOCTOR
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    doctor, _DOCTOR = _DOCTOR, None
    for name, original in _ORIGINALS.items():
        for module in (c10d, dist):
            if getattr(getattr(module, name, None), "_hasten_doctor", False):
                setattr(module, name, original)
    _ORIGINALS.clear()
    if doctor is not None:
        doctor.stopped.set()
        doctor.wake.set()
