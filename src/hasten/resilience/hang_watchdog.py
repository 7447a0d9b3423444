"""The hang doctor's watchdog thread (one per rank: it answers where this rank is, obeys a published report and
reports a collective past the timeout or a rank that left before it), and how a rank leaves (raised, or exited).

`Watchdog` is a part of `hang_doctor.Doctor` (it reads the doctor's state and makes its reports through
`hang_verdict.Verdicts`).
"""

from __future__ import annotations

import json
import sys
import threading
import time

from ..core.errors import HangDetectedError
from . import liveness
from .call_sites import short, skip_prefixes
from .hang_report import TERMINAL

POLL = 0.2  # seconds between two looks of the watchdog at the store
QUEUED_SHARE = 0.9  # a queued collective is reported at this share of the collective timeout (see Doctor._limit)


class Watchdog:
    # -- the watchdog thread ------------------------------------------------------------------------------------
    def _watch(self) -> None:
        store = self.watch_store
        seen, posted = 0, 0.0
        verdict = None
        while not self.stopped.wait(POLL):
            try:
                events = store.add("events", 0)
                if events == seen and time.monotonic() - posted >= liveness.HEARTBEAT:
                    posted = time.monotonic()  # where this rank is, left for a report if it freezes
                    self._post(store, seen)
                if events != seen:
                    seen, posted = events, time.monotonic()
                    self._post(store, events)
                    verdict = verdict or self._published()
                    if verdict is None:
                        self._look_for_leavers(store)
                if verdict is not None:
                    self._obey(verdict)
                    continue
                entry = self.waiting_in()
                if entry is not None and time.time() - entry.since >= self._limit(entry):
                    with self.report_lock:
                        if self.waiting_in() is entry and self._published() is None:
                            self._timeout_report(entry, self.survey(store), raise_here=False)
                if self.cleaners:
                    self._clean(store)
            except (RuntimeError, OSError):  # torch's store errors: the store is gone (the run is ending)
                return
            except Exception as error:  # noqa: BLE001 - a fault of the doctor's own: said, never hidden
                print(f"hasten hang doctor: rank {self.rank}'s watchdog stopped ({type(error).__name__}: {error}); "
                      "hangs are no longer reported", file=sys.stderr, flush=True)
                return

    def _limit(self, entry) -> float:
        """Seconds after which `entry` counts as hung. A queued collective is reported at 90 % of the timeout:
        at the timeout itself NCCL's own watchdog aborts the process, and the report must be written first."""
        return QUEUED_SHARE * self.timeout if entry.queued else self.timeout

    def _look_for_leavers(self, store) -> None:
        """If this rank waits for a collective and a rank has left, report when it left before it."""
        entry = self.waiting_in()
        if entry is None:
            return
        left = []
        for rank in range(self.world_size):
            if rank != self.rank and store.check([f"s/{rank}"]):
                if json.loads(store.get(f"s/{rank}"))["state"] in TERMINAL:
                    left.append(rank)
        if left and self.checked != (entry, tuple(left)):
            self.checked = (entry, tuple(left))
            with self.report_lock:
                if self._published() is None:
                    self._left_report(entry, self.survey(store), raise_here=False)

    def _obey(self, verdict) -> None:
        # The main thread raising the report itself ends the process its own way; give it time to do so.
        if self.raising_since is not None and time.monotonic() - self.raising_since < self.wait + 5:
            return
        with self.report_lock:
            self.stop(verdict)

    # -- how a rank leaves --------------------------------------------------------------------------------------
    def on_uncaught(self, kind, value, tb) -> None:
        if isinstance(value, HangDetectedError) or self.state in TERMINAL:
            return
        frames = []
        while tb is not None:
            frames.append(tb)
            tb = tb.tb_next
        user = [t for t in frames if not t.tb_frame.f_code.co_filename.startswith(skip_prefixes())]
        where = user[-1] if user else (frames[-1] if frames else None)
        site = f" at {short(where.tb_frame.f_code.co_filename)}:{where.tb_lineno}" if where else ""
        message = (str(value).strip().splitlines() or [""])[0][:200]
        self.error = f"{kind.__name__}: {message}{site}"
        self.final_stack = [f"{short(t.tb_frame.f_code.co_filename)}:{t.tb_lineno} in {t.tb_frame.f_code.co_name}"
                            for t in user[-8:]]
        frozen = liveness.after_timeout(self.store, self.rank, self.world_size, value)
        if frozen:
            print(f"hasten hang doctor: rank {self.rank}'s collective timed out: {frozen}", file=sys.stderr, flush=True)
        self._leave_as("raised")

    def on_exit(self) -> None:
        # A mismatch in the script's last collectives is still reported (bounded: the store may be gone).
        self.flush(self.wait)
        if self.state not in TERMINAL:
            self.final_stack = []
            self._leave_as("exited")
        self.stopped.set()
        self.wake.set()
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(timeout=2 * POLL + 1)

    def _leave_as(self, state: str) -> None:
        self.state = state
        if self.broken:
            return
        try:
            self._post(self.store, 0)
            self.store.add("events", 1)
        except Exception:  # noqa: BLE001 - the store may be gone at exit
            pass
