"""Comet ML: `comet_ml.start(project_name=run_name, **init_kwargs)`. With `online=False` (or
`COMET_START_ONLINE=false`) the run is saved as a zip under `COMET_OFFLINE_DIRECTORY`, to upload later
with `comet upload <zip>`."""

from __future__ import annotations

from .base import GeneralTracker, import_library, is_number, on_main_process, simplify, to_plain


class CometMLTracker(GeneralTracker):
    name = "comet_ml"
    requires_logging_directory = False

    def __init__(self, run_name: str, **kwargs):
        super().__init__()
        self.run_name = run_name
        self.init_kwargs = kwargs
        self.writer = None

    @property
    def tracker(self):
        return self.writer

    @on_main_process
    def start(self):
        comet_ml = import_library(self.name)
        self.writer = comet_ml.start(project_name=self.run_name, **self.init_kwargs)

    @on_main_process
    def store_init_configuration(self, values: dict):
        # Comet flattens nested dicts itself ("outer|inner").
        self.writer.log_parameters(to_plain(values))

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs):
        if step is not None:
            self.writer.set_step(step)
        for key, value in values.items():
            value = simplify(value)
            if is_number(value):
                self.writer.log_metric(key, value, step=step, **kwargs)
            elif isinstance(value, dict):
                self.writer.log_metrics(to_plain(value), prefix=key, step=step, **kwargs)
            else:
                self.writer.log_other(key, str(to_plain(value)) if not isinstance(value, str) else value)

    @on_main_process
    def finish(self):
        if self.writer is not None:
            self.writer.end()
            self.writer = None
