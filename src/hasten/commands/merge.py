"""Accelerate's `commands.merge` path (`accelerate merge-weights`); the command is `hasten.commands.merge_weights`."""

from __future__ import annotations

import sys

from .merge_weights import main
from .merge_weights import merge_weights_parser as merge_command_parser  # noqa: F401


def merge_command(args) -> int:
    """Run merge-weights for a parsed command line (from `merge_command_parser`)."""
    argv = [args.checkpoint_directory, args.output_path]
    argv += ["--unsafe_serialization"] * bool(args.unsafe_serialization)
    argv += ["--remove_checkpoint_dir"] * bool(args.remove_checkpoint_dir)
    return main(argv)


if __name__ == "__main__":
    sys.exit(main())
