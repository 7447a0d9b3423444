"""`hasten config default`: a config for this machine without questions."""

from __future__ import annotations

from ...config import file as config_file
from ...config.file import write_basic_config  # noqa: F401  (Accelerate's import path)
from ...config.settings import get

description = "Write a config for this machine (every accelerator, one process each) without questions."


def default_command_parser(parser, parents):
    sub = parser.add_parser("default", parents=parents, description=description, allow_abbrev=False)
    sub.add_argument("--config_file", "--config-file", default=None, dest="config_file",
                     help=f"Where to write (default {config_file.default_config_path()}).")
    row = get("mixed_precision")
    built = [value for value in row.allowed() if value != "fp8"]  # as Accelerate: no fp8 here
    sub.add_argument("--mixed_precision", "--mixed-precision", default="no", type=str.lower, choices=built,
                     help=row.help)
    sub.set_defaults(func=default_config_command)
    return sub


def default_config_command(args) -> int:
    path = args.config_file or config_file.default_config_path()
    written = config_file.write_basic_config(args.mixed_precision, path)
    if not written:
        return 1
    print(f"hasten config: wrote {written}")
    return 0
