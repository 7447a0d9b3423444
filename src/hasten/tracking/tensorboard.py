"""TensorBoard: event files under `<logging_dir>/<run_name>`, written by `torch.utils.tensorboard`."""

from __future__ import annotations

import os

from .base import GeneralTracker, flatten, import_library, is_number, on_main_process, scalar_or_text, to_plain


class TensorBoardTracker(GeneralTracker):
    """Writes scalars, text, hyperparameters and images to TensorBoard event files.

    View with `tensorboard --logdir <logging_dir>`. Nested dicts are logged as `parent/child` scalars in the
    same run (Accelerate's `add_scalars` made one extra run folder per key instead).
    """

    name = "tensorboard"
    requires_logging_directory = True

    def __init__(self, run_name: str, logging_dir: str | os.PathLike, **kwargs):
        super().__init__()
        self.run_name = run_name
        self.logging_dir = os.path.join(os.fspath(logging_dir), run_name)
        self.writer_kwargs = kwargs
        self.writer = None

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
        # The three hparams summaries go into this run's own event file (add_hparams would open a second
        # run folder named after the current time).
        writer = self.writer._get_file_writer()
        for summary in hparams(flat, {}):
            writer.add_summary(summary)
        os.makedirs(self.logging_dir, exist_ok=True)
        with open(os.path.join(self.logging_dir, "hparams.yml"), "w") as stream:
            yaml.safe_dump(to_plain(values), stream)
        self.writer.flush()

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs):
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
