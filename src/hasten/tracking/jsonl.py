"""A tracker with no dependency: one JSON object per line in `<logging_dir>/<run_name>/metrics.jsonl`.

A hasten extension (`log_with="jsonl"`), handy for tests, quick plots and machines without a tracker.
"""

from __future__ import annotations

import json
import os
import time

from .base import GeneralTracker, on_main_process, to_plain


class JSONLinesTracker(GeneralTracker):
    """Writes `{"step": s, "time": t, "values": {...}}` lines, and the config to `config.json`.

    Each line is flushed at once, so the file can be tailed (`tail -f`) or read while training runs.
    """

    name = "jsonl"
    requires_logging_directory = True

    def __init__(self, run_name: str, logging_dir: str | os.PathLike):
        super().__init__()
        self.run_name = run_name
        self.logging_dir = os.path.join(os.fspath(logging_dir), run_name)
        self.stream = None

    @property
    def tracker(self):
        return self.stream

    @on_main_process
    def start(self):
        os.makedirs(self.logging_dir, exist_ok=True)
        self.stream = open(os.path.join(self.logging_dir, "metrics.jsonl"), "a", encoding="utf-8")

    @on_main_process
    def store_init_configuration(self, values: dict):
        with open(os.path.join(self.logging_dir, "config.json"), "w", encoding="utf-8") as stream:
            json.dump(to_plain(values), stream, indent=2, sort_keys=True, default=str)

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs):
        record = {"step": step, "time": time.time(), "values": to_plain(values)}
        self.stream.write(json.dumps(record, default=str, allow_nan=True) + "\n")
        self.stream.flush()

    @on_main_process
    def finish(self):
        if self.stream is not None:
            self.stream.close()
            self.stream = None
