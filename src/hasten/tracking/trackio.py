"""Trackio: a local SQLite database per project (under `TRACKIO_DIR`, default
`~/.cache/huggingface/trackio`); view it with `trackio show --project <name>`."""

from __future__ import annotations

from .base import GeneralTracker, import_library, on_main_process, simplify, to_plain


class TrackioTracker(GeneralTracker):
    name = "trackio"
    requires_logging_directory = False

    def __init__(self, run_name: str, **kwargs):
        super().__init__()
        self.run_name = run_name
        self.init_kwargs = kwargs
        self.run = None

    @property
    def tracker(self):
        return self.run

    @on_main_process
    def start(self):
        trackio = import_library(self.name)
        self.run = trackio.init(project=self.run_name, **self.init_kwargs)

    @on_main_process
    def store_init_configuration(self, values: dict):
        self.run.config.update(to_plain(values))

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs):
        self.run.log({key: simplify(value) for key, value in values.items()}, step=step, **kwargs)

    @on_main_process
    def finish(self):
        if self.run is not None:
            self.run.finish()
            self.run = None
