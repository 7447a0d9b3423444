"""The DeepSpeed config itself: loading it (a dict, a JSON file, JSON or base64 text) and reading it by dotted key
(`HfDeepSpeedConfig`, Accelerate's name). The plugin that fills and checks it is `hasten.config.deepspeed`.

Nothing here imports deepspeed.
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
import os

from ..core.errors import ConfigError
from ..core.env import parse_bool

AUTO = "auto"


def _load_config(source) -> dict:
    """A DeepSpeed config from a dict, a JSON file path, a JSON string or base64-encoded JSON."""
    if isinstance(source, dict):
        return copy.deepcopy(source)
    if isinstance(source, HfDeepSpeedConfig):
        return copy.deepcopy(source.config)
    if not isinstance(source, (str, os.PathLike)):
        raise ConfigError(
            f"hf_ds_config must be a dict, a path to a JSON file, a JSON string or an HfDeepSpeedConfig; got "
            f"{type(source).__name__}"
        )
    text = os.fspath(source)
    if os.path.isfile(os.path.expanduser(text)):
        path = os.path.expanduser(text)
        try:
            with open(path, encoding="utf-8") as handle:
                return json.load(handle)
        except json.JSONDecodeError as error:
            raise ConfigError(f"DeepSpeed config {path} is not valid JSON: {error}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    try:
        return json.loads(base64.urlsafe_b64decode(text).decode("utf-8"))
    except (binascii.Error, UnicodeDecodeError, json.JSONDecodeError, ValueError):
        raise ConfigError(
            f"DeepSpeed config {text!r} is neither an existing file nor JSON (plain or base64); check the path "
            "given to DeepSpeedPlugin(hf_ds_config=...) or --deepspeed_config_file"
        ) from None


class HfDeepSpeedConfig:
    """A DeepSpeed config dict with lookups by dotted key (`"zero_optimization.stage"`)."""

    def __init__(self, config_file_or_dict):
        self.config = _load_config(config_file_or_dict)
        self.set_stage_and_offload()

    def set_stage_and_offload(self) -> None:
        self._stage = self.get_value("zero_optimization.stage", -1)
        self._offload = False
        if self.is_zero2() or self.is_zero3():
            devices = {self.get_value("zero_optimization.offload_optimizer.device"),
                       self.get_value("zero_optimization.offload_param.device")}
            self._offload = bool(devices & {"cpu", "nvme"})

    def find_config_node(self, ds_key_long: str):
        """(the dict holding the last part of `ds_key_long`, that last part); (None, part) if a parent is missing."""
        config = self.config
        *parents, key = ds_key_long.split(".")
        for name in parents:
            config = config.get(name) if isinstance(config, dict) else None
            if config is None:
                return None, key
        return config, key

    def get_value(self, ds_key_long: str, default=None):
        config, key = self.find_config_node(ds_key_long)
        if config is None:
            return default
        return config.get(key, default)

    def del_config_sub_tree(self, ds_key_long: str, must_exist: bool = False) -> None:
        config, key = self.find_config_node(ds_key_long)
        if config is None or key not in config:
            if must_exist:
                raise ConfigError(f"DeepSpeed config has no {ds_key_long!r} to delete")
            return
        del config[key]

    def _is(self, ds_key_long: str, wanted: bool) -> bool:
        value = self.get_value(ds_key_long)
        if value is None or value == AUTO:
            return False
        try:
            return parse_bool(value) is wanted
        except ValueError:
            return False

    def is_true(self, ds_key_long: str) -> bool:
        return self._is(ds_key_long, True)

    def is_false(self, ds_key_long: str) -> bool:
        return self._is(ds_key_long, False)

    def is_zero2(self) -> bool:
        return self._stage == 2

    def is_zero3(self) -> bool:
        return self._stage == 3

    def is_offload(self) -> bool:
        return self._offload
