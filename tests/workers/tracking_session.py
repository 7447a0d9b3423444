"""Which process runs which tracker, through `Accelerator(log_with=...)` in 2 processes.

Usage: tracking_session.py OUT_DIR [crash]. Each rank writes OUT_DIR/rank<i>.json with the calls its trackers
got. With `crash`, rank 0 raises after logging instead of calling `end_training()`.
"""

import atexit
import json
import sys
from pathlib import Path

from hasten import Accelerator
from hasten.tracking import GeneralTracker, on_main_process, register_tracker_class

out = Path(sys.argv[1])
crash = sys.argv[2:] == ["crash"]
calls = []


class EveryRank(GeneralTracker):
    name = "every_rank"
    requires_logging_directory = False
    main_process_only = False

    def __init__(self, run_name=None):
        super().__init__()

    @property
    def tracker(self):
        return calls

    def start(self):
        calls.append([self.name, "start"])

    def store_init_configuration(self, values):
        calls.append([self.name, "config", values])

    def log(self, values, step=None, **kwargs):
        calls.append([self.name, "log", values, step])

    def finish(self):
        calls.append([self.name, "finish"])


class MainOnly(EveryRank):
    name = "main_only"
    main_process_only = True


class Decorated(EveryRank):
    """Uses the decorator the built-in trackers use: it reads `main_process_only` at call time."""

    name = "decorated"

    @on_main_process
    def log(self, values, step=None, **kwargs):
        calls.append([self.name, "log", values, step])


register_tracker_class(MainOnly)
decorated = Decorated()
accelerator = Accelerator(log_with=[EveryRank(), "main_only", decorated, "jsonl"], project_dir=out)
names = []


def dump():
    # Registered before init_trackers, so at exit it runs after the session's own hook has closed the trackers.
    (out / f"rank{accelerator.process_index}.json").write_text(json.dumps({"trackers": names, "calls": calls}))


atexit.register(dump)
accelerator.init_trackers("session", config={"lr": 0.5})
accelerator.log({"loss": 1.0}, step=1)
decorated.main_process_only = True  # decorated log now runs on the main process only
accelerator.log({"loss": 0.5}, step=2)
names.extend(sorted(tracker.name for tracker in accelerator.trackers))
if crash and accelerator.is_main_process:
    raise RuntimeError("training crashed before end_training")
accelerator.end_training()
