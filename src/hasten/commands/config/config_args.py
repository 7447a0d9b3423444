"""Where the config file lives, and loading it (Accelerate's `commands.config.config_args` names).

`hf_cache_home`, `cache_dir`, `default_yaml_config_file`, `default_json_config_file` and `default_config_file` are
computed when read, so they follow `HF_HOME` / `XDG_CACHE_HOME` as they are now (Accelerate fixes them at import).
hasten's own folder is `$HF_HOME/hasten`; an Accelerate file in `$HF_HOME/accelerate` is read when hasten has none.
"""

from __future__ import annotations

import json
import os
from typing import Any

from ...config import file as config_file


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


class ClusterConfig:
    """A checked config file as an object: every key of the file is an attribute (missing keys at their default).

    Built by `load_config_from_file`; `to_dict`, `to_yaml_file` and `to_json_file` write it back, checked again.
    """

    def __init__(self, **values: Any):
        checked = config_file.validate(values, source="ClusterConfig(...)")
        self.__dict__.update(checked)

    def to_dict(self) -> dict:
        return config_file.to_file_dict(dict(self.__dict__))

    def to_yaml_file(self, yaml_file: str) -> None:
        config_file.write_config_file(self.to_dict(), yaml_file)

    def to_json_file(self, json_file: str) -> None:
        """JSON content whatever the file's name (as Accelerate writes it)."""
        config_file.validate(self.to_dict(), source=json_file, fill_defaults=False)
        with open(json_file, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(self.to_dict(), indent=2) + "\n")

    def __repr__(self) -> str:
        return f"ClusterConfig({', '.join(f'{k}={v!r}' for k, v in self.to_dict().items())})"


def load_config_from_file(config_file_path: str | None) -> ClusterConfig:
    """The config at `config_file_path` (or the default file); a missing explicit file is FileNotFoundError."""
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
    return ClusterConfig(**config_file.load_config_file(path, fill_defaults=False))
