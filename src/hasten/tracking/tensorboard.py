"""TensorBoard: event files under `<logging_dir>/<run_name>`, written by `torch.utils.tensorboard`."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping

from .base import GeneralTracker, flatten, import_library, is_number, on_main_process, scalar_or_text, to_plain


class TensorBoardTracker(GeneralTracker):
    """Writes scalars, text, hyperparameters and images to TensorBoard event files.

    View with `tensorboard --logdir <logging_dir>`. As in Accelerate, hyperparameters go through `add_hparams`
    (a run folder named after the time, beside `hparams.yml` in another) and a nested dict through
    `add_scalars` (one run folder per key). With `HASTEN_TENSORBOARD_ONE_RUN=1` the project keeps one run:
    hyperparameters go into the run's own event file and nested dicts become `parent/child` scalars of it.
    """

    name = "tensorboard"
    requires_logging_directory = True

    def __init__(self, run_name: str, logging_dir: str | os.PathLike, **kwargs):
        super().__init__()
        self.run_name = run_name
        self.logging_dir = os.path.join(os.fspath(logging_dir), run_name)
        self.writer_kwargs = kwargs
        self.writer = None
        self.one_run = _one_run()

    @property
    def tracker(self):
        return self.writer

    @on_main_process
    def start(self):
        import_library(self.name)  # torch.utils.tensorboard needs the tensorboard package
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(self.logging_dir, **self.writer_kwargs)

    @on_main_process
    def store_init_configuration(self, values: dict):
        import yaml
        from torch.utils.tensorboard.summary import hparams

        flat = {key: scalar_or_text(value) for key, value in flatten(values).items()}
        if self.one_run:
            # The three hparams summaries go into this run's own event file (add_hparams would open a second
            # run folder named after the current time).
            writer = self.writer._get_file_writer()
            for summary in hparams(flat, {}):
                writer.add_summary(summary)
            folder = self.logging_dir
        else:
            self.writer.add_hparams(flat, metric_dict={})
            folder = os.path.join(self.logging_dir, str(time.time()))
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "hparams.yml"), "w") as stream:
            yaml.safe_dump(to_plain(values), stream)
        self.writer.flush()

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs):
        if not self.one_run:
            rest = {}
            for key, value in values.items():
                inner = flatten(value) if isinstance(value, Mapping) and value else {}
                numbers = {name: item for name, item in inner.items() if is_number(item)}
                if numbers:  # Accelerate's add_scalars: a run folder per inner key
                    self.writer.add_scalars(key, numbers, global_step=step, **kwargs)
                    # what add_scalars cannot take (text, lists) goes to this run as `key/name`, as below
                    rest.update({f"{key}/{name}": item for name, item in inner.items() if name not in numbers})
                else:
                    rest[key] = value
            values = rest
        for key, value in flatten(values).items():
            if is_number(value):
                self.writer.add_scalar(key, value, global_step=step, **kwargs)
            else:
                self.writer.add_text(key, str(value), global_step=step, **kwargs)
        self.writer.flush()

    @on_main_process
    def log_images(self, values: dict, step: int | None = None, **kwargs):
        """`values` maps a tag to an image array or tensor (`dataformats="HWC"` etc. go in kwargs)."""
        for tag, image in values.items():
            self.writer.add_images(tag, image, global_step=step, **kwargs)
        self.writer.flush()

    @on_main_process
    def finish(self):
        if self.writer is not None:
            self.writer.close()


def _one_run() -> bool:
    from ..config.resolve import resolve
    from ..config.settings import get

    return bool(resolve(settings=[get("tensorboard_one_run")])["tensorboard_one_run"].value)
