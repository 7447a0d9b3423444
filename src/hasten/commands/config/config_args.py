"""Where the config file lives, and loading it (Accelerate's `commands.config.config_args` names).

`hf_cache_home`, `cache_dir`, `default_yaml_config_file`, `default_json_config_file` and `default_config_file` are
computed when read, so they follow `HF_HOME` / `XDG_CACHE_HOME` as they are now (Accelerate fixes them at import).
hasten's own folder is `$HF_HOME/hasten`; an Accelerate file in `$HF_HOME/accelerate` is read when hasten has none.
"""

from __future__ import annotations

import os

from ...config import file as config_file
from ...config.file_objects import BaseConfig, ClusterConfig, SageMakerConfig  # noqa: F401 - Accelerate's path


def __getattr__(name: str):
    if name == "hf_cache_home":
        return config_file.hf_home()
    if name == "cache_dir":
        return os.path.dirname(config_file.default_config_path())
    if name in ("default_yaml_config_file", "default_json_config_file"):
        return config_file.default_config_path()
    if name == "default_config_file":
        return config_file.find_config_file() or config_file.default_config_path()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def load_config_from_file(config_file_path: str | None) -> BaseConfig:
    """The config at `config_file_path` (or the default file): a `ClusterConfig`, or a `SageMakerConfig` for a
    file whose compute_environment is AMAZON_SAGEMAKER. A missing explicit file is FileNotFoundError."""
    if config_file_path is not None and not os.path.isfile(config_file_path):
        raise FileNotFoundError(
            f"config file {config_file_path!r} does not exist; pass an existing file, or create one with "
            f"`hasten config --config_file {config_file_path}`"
        )
    path = config_file_path or config_file.find_config_file()
    if path is None:
        raise FileNotFoundError(
            f"no config file at {config_file.default_config_path()}; create one with `hasten config` or "
            "`hasten config default`"
        )
    raw = config_file.read_raw(path)
    if isinstance(raw, dict) and str(raw.get("compute_environment", "")) == "AMAZON_SAGEMAKER":
        return SageMakerConfig.from_yaml_file(path)  # data only: `hasten launch` refuses SageMaker configs
    return ClusterConfig(**config_file.load_config_file(path, fill_defaults=False))
