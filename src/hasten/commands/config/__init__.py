"""`hasten config`: write a config file by answering questions, or non-interactively; update it; explain it.

    hasten config [--config_file PATH]              questionnaire (numbered choices, defaults from this machine)
    hasten config default [--config_file PATH] [--mixed_precision bf16]
    hasten config update [--config_file PATH]       re-check and rewrite in the current form
    hasten config explain [launch flags...]         every value `hasten launch` would use, and its source

The modules follow Accelerate's `accelerate.commands.config` layout: `config_args` (file locations, loading),
`cluster` (the questions), `config_utils` (asking), `default`, `update`, plus hasten's `explain`.
"""

from __future__ import annotations

import argparse
import sys

from ...core.errors import ConfigError
from .cluster import get_cluster_input, questionnaire  # noqa: F401
from .config import config_command, config_command_parser
from .config_args import load_config_from_file  # noqa: F401
from .config_utils import Questions  # noqa: F401
from .default import default_command_parser
from .explain import explain_command_parser
from .update import update_command_parser

SUBCOMMANDS = ("default", "update", "explain")


def __getattr__(name: str):
    if name == "default_config_file":  # computed when read, so it follows HF_HOME
        from . import config_args

        return config_args.default_config_file
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def get_config_parser(subparsers=None) -> argparse.ArgumentParser:
    """The `config` parser with its `default`, `update` and `explain` subcommands."""
    parent = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser = config_command_parser(subparsers)
    parser.set_defaults(func=config_command)
    subcommands = parser.add_subparsers(title="subcommands", dest="subcommand")
    default_command_parser(subcommands, parents=[parent])
    update_command_parser(subcommands, parents=[parent])
    explain_command_parser(subcommands, parents=[parent])
    return parser


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    action = argv[0] if argv and not argv[0].startswith("-") else None
    if action is not None and action not in SUBCOMMANDS:
        print(f"hasten config: unknown action {action!r}; choose default, update or explain "
              "(or nothing, for the questionnaire)", file=sys.stderr)
        return 2
    try:
        args = get_config_parser().parse_args(argv)
        return args.func(args)
    except ConfigError as error:
        print(f"hasten config: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nhasten config: cancelled", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
