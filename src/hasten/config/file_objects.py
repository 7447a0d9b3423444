"""A config file as an object (Accelerate's `BaseConfig`, `ClusterConfig`, `SageMakerConfig`).

`ClusterConfig` is a local machine's file, checked by the same rules as `hasten launch` reads it.
`SageMakerConfig` holds an Amazon SageMaker file's values so such a file can be read and written back; hasten runs
no SageMaker jobs, and `hasten launch` refuses a SageMaker config in one line.
"""

from __future__ import annotations

import enum
import json
from typing import Any

from . import file as config_file

_BASE_FIELDS = ("compute_environment", "distributed_type", "mixed_precision", "use_cpu", "debug")


class BaseConfig:
    """The keys every config file has (`compute_environment`, `distributed_type`, `mixed_precision`, `use_cpu`,
    `debug`) as attributes, and the file helpers: `to_dict`, `from_yaml_file`/`from_json_file` (the default file
    when no path is given), `to_yaml_file`/`to_json_file`. Subclasses say which keys they hold by `_checked`."""

    def __init__(self, **values: Any):
        self.__dict__.update(self._checked(values, f"{type(self).__name__}(...)"))

    @classmethod
    def _checked(cls, values: dict, source: str) -> dict:
        unknown = sorted(set(values) - set(_BASE_FIELDS))
        if unknown:
            raise config_file.ConfigFileError(f"{source}: unknown key(s) {unknown}; {cls.__name__} holds "
                                              f"{list(_BASE_FIELDS)}")
        return {"use_cpu": False, "debug": False, **values}

    @classmethod
    def _from_file(cls, path: str | None):
        path = path or config_file.find_config_file() or config_file.default_config_path()
        raw = config_file.read_raw(path)
        if not isinstance(raw, dict):
            config_file.validate(raw, source=path)  # raises the one-line "must be a mapping" error
        loaded = cls.__new__(cls)
        loaded.__dict__.update(cls._checked(raw, path))
        return loaded

    @classmethod
    def from_yaml_file(cls, yaml_file: str | None = None):
        return cls._from_file(yaml_file)

    @classmethod
    def from_json_file(cls, json_file: str | None = None):
        return cls._from_file(json_file)

    def to_dict(self) -> dict:
        """The keys that are set (None values and empty blocks left out), enums as their values."""
        plain = {k: v.value if isinstance(v, enum.Enum) else v for k, v in self.__dict__.items()}
        return {k: v for k, v in plain.items() if v is not None and v != {}}

    def to_yaml_file(self, yaml_file: str) -> None:
        import yaml

        with open(yaml_file, "w", encoding="utf-8") as handle:
            yaml.safe_dump(self.to_dict(), handle)

    def to_json_file(self, json_file: str) -> None:
        """JSON content whatever the file's name (as Accelerate writes it)."""
        with open(json_file, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(self.to_dict(), indent=2) + "\n")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.to_dict().items())})"


class ClusterConfig(BaseConfig):
    """A checked local-machine config: every key of the file is an attribute (missing keys at their default).

    Built by `load_config_from_file`; `to_dict`, `to_yaml_file` and `to_json_file` write it back, checked again.
    """

    @classmethod
    def _checked(cls, values: dict, source: str) -> dict:
        return config_file.validate(values, source=source)

    def to_dict(self) -> dict:
        return config_file.to_file_dict(dict(self.__dict__))

    def to_yaml_file(self, yaml_file: str) -> None:
        config_file.write_config_file(self.to_dict(), yaml_file)

    def to_json_file(self, json_file: str) -> None:
        config_file.validate(self.to_dict(), source=json_file, fill_defaults=False)
        super().to_json_file(json_file)


# Accelerate's SageMakerConfig fields beyond the base ones, with its defaults (None: no default).
_SAGEMAKER_FIELDS = {
    "ec2_instance_type": None, "iam_role_name": None, "image_uri": None, "profile": None, "region": "us-east-1",
    "num_machines": 1, "gpu_ids": "all", "base_job_name": "accelerate-sagemaker-1", "pytorch_version": None,
    "transformers_version": None, "py_version": None, "sagemaker_inputs_file": None, "sagemaker_metrics_file": None,
    "additional_args": None, "dynamo_config": None, "enable_cpu_affinity": False, "num_processes": None,
}


class SageMakerConfig(BaseConfig):
    """An Amazon SageMaker config's values (`ec2_instance_type` and `iam_role_name` required). Only data: hasten
    launches no SageMaker job, and `hasten launch` refuses such a config."""

    @classmethod
    def _checked(cls, values: dict, source: str) -> dict:
        values = dict(values)
        environment = values.setdefault("compute_environment", "AMAZON_SAGEMAKER")
        if str(getattr(environment, "value", environment)) != "AMAZON_SAGEMAKER":
            raise config_file.ConfigFileError(f"{source}: a SageMakerConfig has compute_environment "
                                              f"AMAZON_SAGEMAKER, not {environment!r}; use ClusterConfig")
        missing = [k for k in ("distributed_type", "ec2_instance_type", "iam_role_name") if values.get(k) is None]
        if missing:
            raise config_file.ConfigFileError(f"{source}: a SageMaker config needs {missing}; add them")
        if "fp16" in values:  # older files' spellings, read as Accelerate reads them
            values.setdefault("mixed_precision", "fp16" if values.pop("fp16") else "no")
        if "dynamo_backend" in values:
            backend = values.pop("dynamo_backend")
            values.setdefault("dynamo_config", {} if backend == "NO" else {"dynamo_backend": backend})
        unknown = sorted(set(values) - set(_BASE_FIELDS) - set(_SAGEMAKER_FIELDS))
        if unknown:
            raise config_file.ConfigFileError(f"{source}: unknown key(s) {unknown} for a SageMaker config; it holds "
                                              f"{[*_BASE_FIELDS, *_SAGEMAKER_FIELDS]}")
        return {"use_cpu": False, "debug": False, "mixed_precision": "no", **dict(_SAGEMAKER_FIELDS), **values}
