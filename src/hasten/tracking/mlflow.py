"""MLflow: one run in the experiment named after the project, on whatever tracking server
`MLFLOW_TRACKING_URI` names (a `mlflow server`, a database, or MLflow's local default)."""

from __future__ import annotations

import json
import os
import warnings

from .base import GeneralTracker, flatten, import_library, is_number, on_main_process, scalar_or_text


def _env_flag(name: str, default: bool) -> bool:
    from ..core.env import parse_bool

    value = os.environ.get(name)
    try:
        return default if value is None else parse_bool(value)
    except ValueError:  # kept lenient as before: an unclear value means no
        return False


class MLflowTracker(GeneralTracker):
    """The environment variables `MLFLOW_EXPERIMENT_NAME`, `MLFLOW_RUN_ID`, `MLFLOW_TAGS` (JSON) and
    `MLFLOW_NESTED_RUN` win over the arguments, as MLflow users expect. `logging_dir` becomes the
    experiment's artifact location when the experiment is created."""

    name = "mlflow"
    requires_logging_directory = False

    def __init__(self, experiment_name: str = None, logging_dir: str | os.PathLike = None, run_id: str = None,
                 tags: dict | str = None, nested_run: bool = False, run_name: str = None, description: str = None):
        super().__init__()
        self.experiment_name = os.environ.get("MLFLOW_EXPERIMENT_NAME", experiment_name)
        self.run_id = os.environ.get("MLFLOW_RUN_ID", run_id)
        tags = os.environ.get("MLFLOW_TAGS", tags)
        self.tags = json.loads(tags) if isinstance(tags, str) else tags
        self.nested_run = _env_flag("MLFLOW_NESTED_RUN", nested_run)
        self.logging_dir = None if logging_dir is None else os.fspath(logging_dir)
        self.run_name = run_name
        self.description = description
        self.active_run = None
        self._skipped_keys = set()

    @property
    def tracker(self):
        return self.active_run

    @on_main_process
    def start(self):
        mlflow = import_library(self.name)
        experiment_id = None
        if self.experiment_name:
            experiment = mlflow.get_experiment_by_name(self.experiment_name)
            if experiment is None:
                location = None if self.logging_dir is None else os.path.abspath(self.logging_dir)
                experiment_id = mlflow.create_experiment(self.experiment_name, artifact_location=location,
                                                         tags=self.tags)
            else:
                experiment_id = experiment.experiment_id
        self.active_run = mlflow.start_run(run_id=self.run_id, experiment_id=experiment_id, run_name=self.run_name,
                                           nested=self.nested_run, tags=self.tags, description=self.description)

    @on_main_process
    def store_init_configuration(self, values: dict):
        import mlflow
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH, MAX_PARAMS_TAGS_PER_BATCH

        params = {}
        for key, value in flatten(values).items():
            text = str(scalar_or_text(value))
            if len(text) > MAX_PARAM_VAL_LENGTH:
                warnings.warn(f"mlflow: hyperparameter {key!r} is {len(text)} characters long, over MLflow's limit "
                              f"of {MAX_PARAM_VAL_LENGTH}; it is not logged", stacklevel=3)
                continue
            params[key] = text
        items = list(params.items())
        for start in range(0, len(items), MAX_PARAMS_TAGS_PER_BATCH):
            mlflow.log_params(dict(items[start:start + MAX_PARAMS_TAGS_PER_BATCH]))

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs):
        import mlflow

        metrics = {}
        for key, value in flatten(values).items():
            if is_number(value):
                metrics[key] = float(value)
            elif key not in self._skipped_keys:
                # MLflow metrics are numbers only; say so once per key rather than at every step.
                self._skipped_keys.add(key)
                warnings.warn(f"mlflow: {key!r} = {value!r} is not a number and is not logged as a metric",
                              stacklevel=3)
        if metrics:
            mlflow.log_metrics(metrics, step=step, **kwargs)

    @on_main_process
    def log_figure(self, figure, artifact_file: str, **kwargs):
        import mlflow

        mlflow.log_figure(figure=figure, artifact_file=artifact_file, **kwargs)

    @on_main_process
    def log_artifacts(self, local_dir: str, artifact_path: str | None = None):
        import mlflow

        mlflow.log_artifacts(local_dir=local_dir, artifact_path=artifact_path)

    @on_main_process
    def log_artifact(self, local_path: str, artifact_path: str | None = None):
        import mlflow

        mlflow.log_artifact(local_path=local_path, artifact_path=artifact_path)

    @on_main_process
    def finish(self):
        if self.active_run is not None:
            import mlflow

            mlflow.end_run()
            self.active_run = None
