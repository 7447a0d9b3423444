"""SwanLab: `swanlab.init(project=run_name, **init_kwargs)`; with `mode="offline"` (or `"local"`) the run is
written under `log_dir` (default `./swanlog`); view it with `swanlab watch <log_dir>`."""

from __future__ import annotations

from .base import ProjectRunTracker, import_library, on_main_process


class SwanLabTracker(ProjectRunTracker):
    name = "swanlab"

    @on_main_process
    def start(self):
        super().start()
        self.run.config.update({"FRAMEWORK": "hasten"})

    @on_main_process
    def log_images(self, values: dict, step: int | None = None, **kwargs):
        """`values` maps a key to a list of images (arrays, tensors or PIL images); kwargs go to `swanlab.Image`."""
        swanlab = import_library(self.name)
        images = {key: [swanlab.Image(image, **kwargs) for image in items] for key, items in values.items()}
        self.run.log(images, step=step)
