"""ClearML: a ClearML Task (the current one if the script already made it). Offline, with
`CLEARML_OFFLINE_MODE=1`, the session is stored under `~/.clearml/cache/offline/<task id>` and its zip, to
import later with `clearml-task --import-offline-session` or `Task.import_offline_session`."""

from __future__ import annotations

import os

from .base import GeneralTracker, flatten, import_library, is_number, on_main_process, simplify, to_plain

_SPLITS = ("train", "eval", "test")


def _title_and_series(key: str) -> tuple[str, str]:
    # "eval_loss" -> plot "loss", line "eval"; keys without a known prefix are "train" lines.
    for split in _SPLITS:
        for separator in ("_", "/"):
            prefix = split + separator
            if key.startswith(prefix) and len(key) > len(prefix):
                return key[len(prefix):], split
    return key, "train"


class ClearMLTracker(GeneralTracker):
    """`CLEARML_PROJECT` and `CLEARML_TASK` override the project and task names (both default to
    `run_name`). Task.init arguments go in init_kwargs; pass
    `auto_connect_frameworks={"detect_repository": False}` to skip the slow repository scan."""

    name = "clearml"
    requires_logging_directory = False

    def __init__(self, run_name: str | None = None, **kwargs):
        super().__init__()
        self.run_name = run_name
        self.init_kwargs = kwargs
        self.task = None
        self._owns_task = False

    @property
    def tracker(self):
        return self.task

    @on_main_process
    def start(self):
        clearml = import_library(self.name)
        self.task = clearml.Task.current_task()
        if self.task is None:
            kwargs = dict(self.init_kwargs)
            kwargs.setdefault("project_name", os.environ.get("CLEARML_PROJECT", self.run_name))
            kwargs.setdefault("task_name", os.environ.get("CLEARML_TASK", self.run_name))
            self.task = clearml.Task.init(**kwargs)
            self._owns_task = True

    @on_main_process
    def store_init_configuration(self, values: dict):
        self.task.connect_configuration(to_plain(values))

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs):
        logger = self.task.get_logger()
        for key, value in flatten({key: simplify(value) for key, value in values.items()}).items():
            if not is_number(value):
                logger.report_text(f"{key}: {value}", iteration=step)
            elif step is None:
                logger.report_single_value(name=key, value=value, **kwargs)
            else:
                title, series = _title_and_series(key)
                logger.report_scalar(title=title, series=series, value=value, iteration=step, **kwargs)

    @on_main_process
    def log_images(self, values: dict, step: int | None = None, **kwargs):
        """`values` maps a title to an image array/tensor, or a list of them."""
        logger = self.task.get_logger()
        for title, images in values.items():
            images = images if isinstance(images, (list, tuple)) else [images]
            for index, image in enumerate(images):
                logger.report_image(title=title, series=str(index), iteration=step, image=image, **kwargs)

    @on_main_process
    def log_table(self, table_name: str, columns=None, data=None, dataframe=None, step: int | None = None, **kwargs):
        """Log rows (`columns` + `data`) or a pandas `dataframe` as a ClearML table."""
        table = dataframe if dataframe is not None else ([columns, *data] if columns is not None else data)
        title, series = _title_and_series(table_name)
        self.task.get_logger().report_table(title=title, series=series, iteration=step, table_plot=table, **kwargs)

    @on_main_process
    def finish(self):
        if self.task is not None and self._owns_task:
            self.task.close()
        self.task = None
