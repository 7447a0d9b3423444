"""SwanLab: `swanlab.init(project=run_name, **init_kwargs)`; with `mode="offline"` (or `"local"`) the run is
written under `log_dir` (default `./swanlog`); view it with `swanlab watch <log_dir>`."""

from __future__ import annotations

from .base import GeneralTracker, import_library, on_main_process, simplify, to_plain


class SwanLabTracker(GeneralTracker):
    name = "swanlab"
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
        swanlab = import_library(self.name)
        self.run = swanlab.init(project=self.run_name, **self.init_kwargs)
        self.run.config.update({"FRAMEWORK": "hasten"})

    @on_main_process
    def store_init_configuration(self, values: dict):
        self.run.config.update(to_plain(values))

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs):
        self.run.log({key: simplify(value) for key, value in values.items()}, step=step, **kwargs)

    @on_main_process
    def log_images(self, values: dict, step: int | None = None, **kwargs):
        """`values` maps a key to a list of images (arrays, tensors or PIL images); kwargs go to `swanlab.Image`."""
        swanlab = import_library(self.name)
        images = {key: [swanlab.Image(image, **kwargs) for image in items] for key, items in values.items()}
        self.run.log(images, step=step)

    @on_main_process
    def finish(self):
        if self.run is not None:
            self.run.finish()
            self.run = None
