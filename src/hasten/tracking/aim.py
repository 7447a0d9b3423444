"""Aim: a local repository at `<logging_dir>/.aim`; view it with `aim up --repo <logging_dir>`."""

from __future__ import annotations

import os

from .base import GeneralTracker, flatten, import_library, is_number, on_main_process, simplify, to_plain


class AimTracker(GeneralTracker):
    name = "aim"
    requires_logging_directory = True

    def __init__(self, run_name: str, logging_dir: str | os.PathLike = ".", **kwargs):
        super().__init__()
        self.run_name = run_name
        self.logging_dir = os.fspath(logging_dir)
        self.run_kwargs = kwargs
        self.writer = None

    @property
    def tracker(self):
        return self.writer

    @on_main_process
    def start(self):
        aim = import_library(self.name)
        self.writer = aim.Run(repo=self.logging_dir, **self.run_kwargs)
        self.writer.name = self.run_name

    @on_main_process
    def store_init_configuration(self, values: dict):
        self.writer["hparams"] = to_plain(values)

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs):
        import aim

        for key, value in values.items():
            value = simplify(value)
            if isinstance(value, dict):
                for sub_key, sub_value in flatten(value, prefix=key).items():
                    self._track(aim, sub_value, sub_key, step, kwargs)
            else:
                self._track(aim, value, key, step, kwargs)

    def _track(self, aim, value, name, step, kwargs):
        from aim.storage.object import CustomObject

        # Aim tracks numbers and its own objects (Image, Text, ...); anything else is recorded as text.
        if not (is_number(value) or isinstance(value, CustomObject)):
            value = aim.Text(str(to_plain(value)))
        self.writer.track(value, name=name, step=step, **kwargs)

    @on_main_process
    def log_images(self, values: dict, step: int | None = None, kwargs: dict | None = None):
        """`values` maps a name to an image or `(image, caption)`; `kwargs` may hold `aim_image` (passed to
        `aim.Image`) and `track` (passed to `Run.track`)."""
        import aim

        kwargs = kwargs or {}
        image_kwargs, track_kwargs = kwargs.get("aim_image", {}), kwargs.get("track", {})
        for name, value in values.items():
            image, caption = value if isinstance(value, tuple) else (value, "")
            self.writer.track(aim.Image(image, caption=caption, **image_kwargs), name=name, step=step, **track_kwargs)

    @on_main_process
    def finish(self):
        if self.writer is not None:
            self.writer.close()
            self.writer = None
