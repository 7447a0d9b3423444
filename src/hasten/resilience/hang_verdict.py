"""The hang doctor's verdicts: where every rank is (each posts a status on the store), and the one report a run
publishes, raises or stops with when its collectives diverged, a rank left before one, or one timed out.

`Verdicts` is a part of `hang_doctor.Doctor` (it reads the doctor's state: its stores, rank, history, wait).
"""

from __future__ import annotations

import json
import os
import sys
import time

from ..core.errors import HangDetectedError
from . import liveness
from .call_sites import stack_lines
from .hang_report import (
    TERMINAL,
    at,
    calls_at,
    divergence_headline,
    format_report,
    left_headline,
    timeout_headline,
)

REPORT_KEY = "hasten_report"  # where the report sits in a torchelastic error file (read by `hasten launch`)
LAUNCHER_VARIABLE = "HASTEN_LAUNCHER_PRINTS_REPORT"  # set by `hasten launch`: it prints the report itself


class Verdicts:
    # -- where every rank is ------------------------------------------------------------------------------------
    def _status(self, answer: int) -> dict:
        with self.lock:
            entry = self.inside.get(self.main)
            seqs = dict(self.seqs)
            history = [e.as_list() for e in self.history]
        entry = entry or self.unfinished()  # a collective the backend still has not completed
        status = {"rank": self.rank, "state": self.state, "answer": answer, "seqs": seqs, "history": history,
                  "error": self.error, "time": time.time()}
        if self.state in TERMINAL:
            status["stack"] = getattr(self, "final_stack", [])
        else:
            frame = sys._current_frames().get(self.main)
            status["stack"] = stack_lines(frame) if frame is not None else []
            if entry is not None:
                status["state"] = "collective"
                status["entry"] = entry.as_list()
        return status

    def _post(self, store, answer: int) -> None:
        store.set(f"s/{self.rank}", json.dumps(self._status(answer)))

    def survey(self, store) -> dict:
        """Ask every rank where it is; {rank: status} of those that answered within the wait."""
        ask = store.add("events", 1)
        self._post(store, ask)
        keys = [f"s/{rank}" for rank in range(self.world_size)]
        answers = {}
        deadline = time.monotonic() + self.wait
        while True:
            for rank, key in enumerate(keys):
                if rank in answers or not store.check([key]):
                    continue
                status = json.loads(store.get(key))
                if status["answer"] >= ask or status["state"] in TERMINAL:
                    answers[rank] = status
            if len(answers) == self.world_size or time.monotonic() > deadline:
                return answers
            time.sleep(0.05)

    # -- reports ------------------------------------------------------------------------------------------------
    def _report_divergence(self, entry, statuses, known=None, raise_here=False) -> bool:
        """Publish a report if the ranks called different collectives at `entry`'s number; True if one was.

        Each rank's call comes from its status (the collective it waits in, or its history when it passed it);
        `known` adds calls read from the store (the reference rank's).
        """
        calls = {self.rank: (entry.name, entry.detail, entry.site)}
        calls.update(known or {})
        for rank, call in calls_at(statuses, entry.group, entry.seq).items():
            calls.setdefault(rank, call)
        if len({call[:2] for call in calls.values()}) < 2:
            return False
        headline, diverging = divergence_headline(calls, entry.group, entry.seq)
        self._publish(headline, diverging, statuses, raise_here=raise_here, collective=(entry.group, entry.seq))
        return True

    def after_error(self, entry, error) -> None:
        """A collective raised (mismatched sizes, timeout, lost peer): report a divergence, a rank that left
        before it, or the timeout; otherwise the error goes on as it is."""
        import torch.distributed as dist

        if not dist.is_initialized():
            return
        # gloo raises at once on some mismatches: let the checker compare this collective first.
        self.flush(self.wait)
        text = str(error).lower()
        timed_out = "timed out" in text or "timeout" in text
        with self.report_lock:
            if self._published() is not None:
                self._raise_published()
            statuses = self.survey(self._s())
            if self._report_divergence(entry, statuses, raise_here=True):
                return
            if self._left_report(entry, statuses, raise_here=True):
                return
            if timed_out:
                self._timeout_report(entry, statuses, raise_here=True)

    def _left_report(self, entry, statuses, raise_here) -> bool:
        """Publish a report if a rank left (returned or raised) before reaching `entry`; True if one was."""
        members = self.members.get(entry.group, ())
        gone = [r for r, s in sorted(statuses.items()) if r != self.rank and r in members
                and s["state"] in TERMINAL and s["seqs"].get(entry.group, 0) < entry.seq]
        if not gone:
            return False
        headline = left_headline(gone[0], statuses[gone[0]], self.rank, entry)
        self._publish(headline, gone, statuses, raise_here=raise_here, kind="left")
        return True

    def _timeout_report(self, entry, statuses, raise_here) -> None:
        missing = [r for r in self.members.get(entry.group, range(self.world_size))
                   if r != self.rank and not at(statuses.get(r), entry.group, entry.seq)]
        looks = {rank: liveness.look(self._s(), rank) for rank in missing if rank not in statuses}
        self.to_wake = [ident for _, ident in looks.values() if ident is not None]
        headline = timeout_headline(entry, missing, statuses, self.rank, self.timeout,
                                    {rank: words for rank, (words, _) in looks.items()})
        self._publish(headline, missing or [self.rank], statuses, raise_here=raise_here, kind="timeout")

    def _published(self):
        try:
            store = self._s()
            if store.check(["verdict"]):
                return json.loads(store.get("verdict"))
        except Exception:  # noqa: BLE001
            return None
        return None

    def _publish(self, headline, diverging, statuses, raise_here, kind="diverged", collective=None) -> None:
        report = format_report(headline, statuses, self.world_size, kind, collective)
        if kind == "timeout":  # a collective nobody left can be the network: say which interface gloo took
            from ..core.env import gloo_interface_words

            report = report.replace("\nFix: ", f"\nNetwork: {gloo_interface_words()}.\nFix: ", 1)
        value = json.dumps({"report": report, "headline": headline, "diverging": list(diverging),
                            "by": self.rank})
        try:
            store = self._s()
            stored = store.compare_set("verdict", "", value).decode()
            store.add("events", 1)
        except Exception:  # noqa: BLE001
            stored = value
        for ident in self.to_wake:  # a stopped rank: its watchdog can obey the report only once it runs
            liveness.wake(ident)
        verdict = json.loads(stored)
        if raise_here:
            self._raise(verdict)
        self.stop(verdict)

    def _raise_published(self):
        self._raise(self._published())

    def _raise(self, verdict) -> None:
        self.raising_since = time.monotonic()
        self._write_error_file(verdict)
        error = HangDetectedError(verdict["headline"] + " (hasten hang doctor, debug mode: full report below)")
        error.hasten_report = verdict["report"]
        error.hasten_peer_loss = self.rank not in verdict["diverging"]
        error.hasten_reporter = verdict["by"] == self.rank
        raise error

    def stop(self, verdict) -> None:
        """End this process with the published report (its main thread is stuck, or elsewhere)."""
        self._write_error_file(verdict)
        if verdict["by"] == self.rank and not os.environ.get(LAUNCHER_VARIABLE):
            print(verdict["report"], file=sys.stderr, flush=True)
        else:
            print(f"hasten hang doctor: rank {self.rank} stopped: {verdict['headline']}", file=sys.stderr,
                  flush=True)
        sys.stdout.flush()
        os._exit(1)

    def _write_error_file(self, verdict) -> None:
        path = os.environ.get("TORCHELASTIC_ERROR_FILE")
        if not path:
            return
        now = time.time()
        data = {"message": {"message": f"HangDetectedError: {verdict['headline']}", "extraInfo": {
            "py_callstack": verdict["report"], "timestamp": str(int(now)), "hasten_time": repr(now),
            "hasten_peer_loss": self.rank not in verdict["diverging"], REPORT_KEY: verdict["report"]}}}
        try:
            with open(path, "w") as file:
                json.dump(data, file)
        except OSError:
            pass
