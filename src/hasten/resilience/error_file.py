"""The torchelastic error file: an uncaught exception written with a precise time, so that `hasten launch` can
name the rank that failed first (the others fail a moment later, when they lose their peer).
"""

from __future__ import annotations

import os

# Substrings of the errors a rank sees when *another* rank died under it (gloo, NCCL, TCPStore).
PEER_LOSS_MARKERS = (
    "connection closed by peer", "connection reset by peer", "remote worker crash", "broken pipe",
    "remote process exited", "communicator was aborted", "peer closed",
)


def record_uncaught_errors() -> None:
    """Under torchelastic, write an uncaught exception to the worker's error file with a precise time.

    `hasten launch` reads these files to name the rank that failed *first*: when one rank dies, the others
    fail a moment later inside a collective, and the exit order the agent observes is often the wrong way
    round. torch's own `@record` writes the same file; a file it already wrote is left alone.
    """
    import sys

    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not error_file or getattr(sys.excepthook, "_hasten_records", False):
        return
    previous = sys.excepthook

    def excepthook(kind, value, tb):
        try:
            if not os.path.exists(error_file):
                write_error_file(error_file, kind, value, tb)
        except Exception:  # noqa: BLE001 - never hide the user's error behind ours
            pass
        previous(kind, value, tb)

    excepthook._hasten_records = True
    sys.excepthook = excepthook


def write_error_file(path: str, kind, value, tb) -> None:
    import json
    import time
    import traceback

    now = time.time()
    message = f"{kind.__name__}: {value}"
    data = {
        "message": {
            "message": message,
            "extraInfo": {
                "py_callstack": "".join(traceback.format_exception(kind, value, tb)),
                "timestamp": str(int(now)),
                "hasten_time": repr(now),
                "hasten_peer_loss": getattr(value, "hasten_peer_loss", None)
                if getattr(value, "hasten_peer_loss", None) is not None
                else any(m in message.lower() for m in PEER_LOSS_MARKERS),
                # the hang doctor's report (debug mode), which `hasten launch` prints last
                "hasten_report": getattr(value, "hasten_report", None),
            },
        }
    }
    with open(path, "w") as file:
        json.dump(data, file)
