"""DVCLive: plain files (`metrics.json`, `plots/metrics/*.tsv`, `params.yaml`) under the `dir` given in
`init_kwargs` (default `./dvclive`); view them with `dvc plots show` / `dvc exp show` or in VS Code."""

from __future__ import annotations

import warnings

from .base import GeneralTracker, flatten, import_library, on_main_process, simplify, to_plain


class DVCLiveTracker(GeneralTracker):
    """`run_name` is not used by DVCLive (a DVC experiment is named by `exp_name`); pass `live=` to reuse an
    existing `dvclive.Live`, or `Live`'s own arguments (`dir`, `save_dvc_exp`, `dvcyaml`, ...) as kwargs."""

    name = "dvclive"
    requires_logging_directory = False

    def __init__(self, run_name: str | None = None, live=None, **kwargs):
        super().__init__()
        self.live = live
        self.live_kwargs = kwargs
        self._skipped_keys = set()

    @property
    def tracker(self):
        return self.live

    @on_main_process
    def start(self):
        dvclive = import_library(self.name)
        if self.live is None:
            self.live = dvclive.Live(**self.live_kwargs)

    @on_main_process
    def store_init_configuration(self, values: dict):
        self.live.log_params(to_plain(values))

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs):
        from dvclive.plots import Metric

        if step is not None:
            self.live.step = step
        for key, value in flatten({key: simplify(value) for key, value in values.items()}).items():
            if Metric.could_log(value):
                self.live.log_metric(key, value, **kwargs)
            elif key not in self._skipped_keys:
                self._skipped_keys.add(key)
                warnings.warn(f"dvclive: {key!r} = {value!r} is not a number or string and is not logged",
                              stacklevel=3)
        self.live.next_step()

    @on_main_process
    def finish(self):
        if self.live is not None:
            self.live.end()
