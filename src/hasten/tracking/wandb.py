"""Weights & Biases: `wandb.init(project=run_name, **init_kwargs)`; set `mode="offline"` (or the environment
variable `WANDB_MODE=offline`) to write the run under `./wandb` without an account, then `wandb sync` it."""

from __future__ import annotations

from .base import ProjectRunTracker, import_library, on_main_process, to_plain


class WandBTracker(ProjectRunTracker):
    name = "wandb"

    @on_main_process
    def store_init_configuration(self, values: dict):
        self.run.config.update(to_plain(values), allow_val_change=True)

    @on_main_process
    def log_images(self, values: dict, step: int | None = None, **kwargs):
        """`values` maps a key to a list of images (arrays, tensors or PIL images)."""
        wandb = import_library(self.name)
        images = {key: [wandb.Image(image) for image in items] for key, items in values.items()}
        self.run.log(images, step=step, **kwargs)

    @on_main_process
    def log_table(self, table_name: str, columns=None, data=None, dataframe=None, step: int | None = None, **kwargs):
        """Log rows (`columns` + `data`) or a pandas `dataframe` as a wandb Table named `table_name`."""
        wandb = import_library(self.name)
        table = wandb.Table(columns=columns, data=data, dataframe=dataframe)
        self.run.log({table_name: table}, step=step, **kwargs)
