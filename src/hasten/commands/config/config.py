"""`hasten config` without a subcommand: the questionnaire, written to the config file."""

from __future__ import annotations

import os
import sys

from ...config import file as config_file
from .cluster import questionnaire
from .config_utils import Questions, _Cancelled, _Parser

description = "Answer a few questions and write the config file `hasten launch` reads."

# Keys the questionnaire asks; every other key of an existing file survives an edit unchanged.
ASKED_KEYS = {
    "compute_environment", "distributed_type", "use_cpu", "num_processes", "num_machines", "machine_rank",
    "main_process_ip", "main_process_port", "rdzv_backend", "same_network", "gpu_ids", "fsdp_config",
    "dynamo_config", "debug", "mixed_precision",
}


def config_command_parser(subparsers=None):
    if subparsers is not None:
        parser = subparsers.add_parser("config", description=description, allow_abbrev=False)
    else:
        parser = _Parser(prog="hasten config", description=description, allow_abbrev=False)
    parser.add_argument("--config_file", "--config-file", default=None,
                        help=f"Where to write (default {config_file.default_config_path()}).")
    if subparsers is not None:
        parser.set_defaults(func=config_command)
    return parser


def get_user_input(existing: dict | None = None) -> dict:
    """Ask every question on this terminal; returns the config mapping (not yet written)."""
    return questionnaire(Questions(), config_file.detect_machine(), existing)


def config_command(args) -> int:
    path = args.config_file or config_file.default_config_path()
    existing, kept = {}, {}
    if os.path.isfile(path):
        existing = config_file.load_config_file(path)
        kept = {k: v for k, v in config_file.load_config_file(path, fill_defaults=False).items()
                if k not in ASKED_KEYS}
        print(f"Editing {path}; press Enter to keep a value.")
    try:
        config = get_user_input(existing)
    except _Cancelled:
        print("\nhasten config: cancelled; nothing was written", file=sys.stderr)
        return 1
    config_file.write_config_file({**kept, **config}, path)
    print(f"hasten config: wrote {path}")
    return 0


def main(argv=None) -> int:
    """`hasten config` (the questionnaire) as a program of its own."""
    return config_command(config_command_parser().parse_args(argv))
