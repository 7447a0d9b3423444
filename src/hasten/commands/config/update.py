"""`hasten config update`: re-check a config file and rewrite it in the current form."""

from __future__ import annotations

import os

from ...config import file as config_file
from ...core.errors import ConfigError

description = "Re-check a config file and rewrite it in the current form (legacy keys rewritten)."


def update_config(args) -> str:
    """Rewrite the file; returns the path written. An Accelerate file is copied to hasten's folder instead."""
    path = args.config_file or config_file.find_config_file(None)
    if path is None:
        raise ConfigError(
            f"no config file to update: {config_file.default_config_path()} does not exist; fix: create one with "
            "`hasten config` or `hasten config default`"
        )
    config = config_file.load_config_file(path, fill_defaults=False)
    target = path
    if os.path.abspath(path) == os.path.abspath(config_file.accelerate_config_path()) and not args.config_file:
        target = config_file.default_config_path()  # never rewrite Accelerate's own file behind its back
    config_file.write_config_file(config, target)
    print(f"hasten config: updated {target}" + (f" (from {path})" if target != path else ""))
    return target


def update_command_parser(parser, parents):
    sub = parser.add_parser("update", parents=parents, description=description, allow_abbrev=False)
    sub.add_argument("--config_file", "--config-file", default=None, dest="config_file",
                     help="The file to update (default: the one `hasten launch` would read).")
    sub.set_defaults(func=update_config_command)
    return sub


def update_config_command(args) -> int:
    update_config(args)
    return 0
