"""`hasten launch`: the command line (generated from the settings table) and the command that runs it.

The launcher turns flags into `HASTEN_*` environment variables that `hasten.state` reads in every process. The
plan (`hasten.launch.plan`) and the runner (`hasten.launch.run`) live in `launch/`; Accelerate's names for them are
kept importable here.
"""

from __future__ import annotations

import argparse
import copy
import sys

from ..core.errors import ConfigError, LaunchError, PortInUseError  # noqa: F401 - PortInUseError: importable here
from ..core.env import parse_bool, parse_int
from ..launch.machine import get_free_port  # noqa: F401 - importable here, as before
from ..launch.plan import (  # noqa: F401 - defined in launch/plan.py, importable here
    PORT_IN_USE_WARNING,
    LaunchPlan,
    _port_in_use,
    _resolve_port,
    _script_command,
    _target_command,
    _with_launch_defaults,
    flag_default,
    plan_launch,
)
from ..launch.run import (  # noqa: F401 - defined in launch/run.py; Accelerate's launchers at its path
    _agent_signals,
    _describe_failures,
    _failure_facts,
    _hang_report,
    _logs_specs,
    _run_distributed,
    _run_in_place,
    _run_mpirun,
    deepspeed_launcher,
    multi_gpu_launcher,
    run,
    simple_launcher,
)


class _Parser(argparse.ArgumentParser):
    """argparse that ends a bad command line with one line and a pointer to --help, not a page of usage."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def _add(parser_or_group, *names, **kwargs):
    """Register a flag under its `--snake_case` and `--kebab-case` spellings, as Accelerate does."""
    spellings = []
    for name in names:
        spellings.append(name)
        if name.startswith("--") and "_" in name:
            spellings.append(name.replace("_", "-"))
    return parser_or_group.add_argument(*spellings, **kwargs)


# a paradigm switch -> the help group of its own options (shown only when the switch is typed, see below)
options_to_group = {
    "multi_gpu": "Distributed GPUs",
    "tpu": "TPU",
    "use_deepspeed": "DeepSpeed (with --use_deepspeed)",
    "use_fsdp": "FSDP (with --use_fsdp; exported as FSDP_* variables)",
    "use_megatron_lm": "Megatron-LM (with --use_megatron_lm; served by hasten's TP/PP/FSDP)",
    "fp8_backend": "FP8 (with --mixed_precision fp8)",
}


def clean_option(option: str):
    """`--some-flag` -> `some_flag` (the argparse destination); anything not starting with `--` -> None.
    Any `--fp8_*` spelling names the FP8 group's switch, `fp8_backend`."""
    if "fp8_backend" in option:
        return "fp8_backend"
    if option.startswith("--"):
        return option[2:].replace("-", "_")
    return None


class CustomHelpFormatter(argparse.HelpFormatter):
    """`hasten launch --help`: each flag under its `--snake_case` spelling only (the `--kebab-case` twin is
    accepted but not listed twice), and, when the command line names a paradigm (`--use_fsdp -h`), the option
    groups of the other paradigms are left out, so the help shows what that run can use."""

    def add_argument(self, action):
        args = sys.argv[1:]
        if args[:1] == ["launch"]:
            args = args[1:]
        typed = {clean_option(arg) for arg in args}
        chosen = [dest for dest in options_to_group if dest in typed]
        group = getattr(getattr(action, "container", None), "title", None)
        if chosen and group in options_to_group.values() and group not in {options_to_group[d] for d in chosen}:
            return  # another paradigm's options
        if action.option_strings:
            action = copy.copy(action)  # the parser keeps every spelling; only the listing is shortened
            action.option_strings = [s for s in action.option_strings if "-" not in s[2:]] or action.option_strings
        super().add_argument(action)


def launch_command_parser(subparsers=None) -> argparse.ArgumentParser:
    description = ("Launch a training script on one or more processes (and machines). Every flag is listed as "
                   "--snake_case and also answers to its --kebab-case spelling (--num-processes).")
    if subparsers is not None:
        parser = subparsers.add_parser("launch", description=description, allow_abbrev=False,
                                       formatter_class=CustomHelpFormatter)
    else:
        parser = _Parser(prog="hasten launch", description=description, allow_abbrev=False,
                         formatter_class=CustomHelpFormatter)
    add_launch_arguments(parser)
    parser.add_argument("training_script", help="The script (or module with -m) to run.")
    parser.add_argument("training_script_args", nargs=argparse.REMAINDER, help="Arguments for the script.")
    if subparsers is not None:
        parser.set_defaults(func=launch_command)
    return parser


GROUP_ORDER = ("General", "Hardware selection", "Resource selection", "Training paradigm", "Distributed GPUs")


def _flag_type(row):
    """argparse `type` for a row: the table's own conversion, with argparse's one-line error on bad text."""
    from ..config import settings as table

    def convert(text):
        if isinstance(text, table.ParserDefault):
            return text  # argparse converts a text default too: keep it marked as not typed
        try:
            if row.kind == "int":
                value = parse_int(text, row.minimum, row.maximum)
                if row.choices and value not in row.choices:
                    raise ValueError(f"{value} is not one of {', '.join(map(str, row.choices))}")
                return value
            if row.kind == "bool":
                return parse_bool(text)
            if row.kind == "bool_or_str" and text.strip().upper() in (row.choices or ()):
                return text.strip().upper()
            if row.kind == "bool_or_str":
                return parse_bool(text)
            if row.kind == "float":
                value = float(text)
                if row.minimum is not None and not value >= row.minimum:
                    raise ValueError(f"{value:g} is negative; give {row.minimum:g} or more")
                return value
            return row.convert(text)
        except ValueError as error:
            message = str(error)
            if row.range_text and "integer" not in message:
                message = f"{text} is not {row.range_text}"
            elif message.startswith("expected"):
                message = f"{text!r}: {message}"
            raise argparse.ArgumentTypeError(message) from None

    convert.__name__ = row.kind  # argparse names the type in "invalid <type> value" messages
    return convert


def add_launch_arguments(parser) -> None:
    """Every launch flag except the script, generated from the settings table (`hasten.config.settings`).

    `hasten config explain` takes the same flags. Settings flags default to None (switches to False) so that
    "not typed" is known:
    the environment and the config file only fill settings whose flag was not typed. Flags of features hasten
    has not built are accepted here and refused with one line when the launch is resolved.
    """
    from ..config import settings as table

    groups = {}
    rows = [row for row in table.SETTINGS if row.flags]
    order = {name: index for index, name in enumerate(GROUP_ORDER)}
    for row in sorted(rows, key=lambda r: order.get(r.group, len(order))):
        if row.group == "General":
            target = parser
        else:
            title = row.group if row.built else f"{row.group} (not built in hasten yet: refused at launch)"
            if title not in groups:
                groups[title] = parser.add_argument_group(title)
            target = groups[title]
        # None, False for a switch (Accelerate's parser: code tests `args.multi_gpu is False`), or a launcher
        # option's default; the resolver reads the first two as "not typed", so the file and environment still apply
        kwargs = {"dest": row.flag_dest, "help": argparse.SUPPRESS if row.hidden else row.help,
                  "default": flag_default(row)}
        if row.switch:
            kwargs["action"] = "store_true"
        elif row.append:
            kwargs["action"] = "append"
        elif row.choices and row.built and row.kind == "str":
            kwargs["choices"] = row.allowed()
            kwargs["type"] = {"lower": str.lower, "upper": str.upper}.get(row.case, str)
        elif row.built and row.kind not in ("str", "gpu_ids"):
            kwargs["type"] = _flag_type(row)
            if row.kind in ("bool", "bool_or_str"):
                kwargs["metavar"] = "{true,false}"
        _add(target, *row.flags, **kwargs)
    features = dict.fromkeys(row.feature for row in rows if not row.built)
    parser.epilog = ("Accepted for Accelerate command lines but not built in hasten yet (refused at launch with one "
                     "line): " + ", ".join(features) + ". See docs/configuration.md.")


def _validate_launch_command(args: argparse.Namespace):
    """Accelerate's step that completes a parsed command line: returns `(args, config, mp_from_config_flag)`.

    Every setting the command line left out is written onto `args` as `hasten launch` resolves it (flag >
    environment > config file > default), so `args` then reads as the launch will run; `config` is the config
    file's `ClusterConfig` (None without a file) and `mp_from_config_flag` whether mixed_precision came from the
    file. Conflicting flags and impossible values raise as `hasten launch` raises them.
    """
    from ..config import settings as table
    from ..config.launch_settings import resolve_launch
    from .config.config_args import load_config_from_file

    resolved_settings = resolve_launch(args, ignored_flags_fail=False)
    path = resolved_settings.config_path
    config = load_config_from_file(path) if path else None
    for name, resolved in resolved_settings.values.items():
        row = table.get(name)
        if row.flags and resolved.source != "flag" and hasattr(args, row.flag_dest):
            untyped = getattr(args, row.flag_dest)
            if resolved.source == "default" and isinstance(untyped, table.ParserDefault):
                # As Accelerate: the file's block value replaces the parser's default (whatever the file's
                # distributed_type), and without one the parser's default stays.
                block = getattr(config, row.file_key[0], None) if config is not None and row.file_key else None
                if isinstance(block, dict) and block.get(row.file_key[-1]) is not None:
                    setattr(args, row.flag_dest, block[row.file_key[-1]])
                continue
            setattr(args, row.flag_dest, resolved.value)
    return args, config, resolved_settings.values["mixed_precision"].source == "file"


def launch_command(args: argparse.Namespace) -> int:
    """Run a parsed `hasten launch` command line: resolve its plan, start the processes, return the exit code."""
    return run(args, plan_launch(args))


def main(argv=None) -> int:
    parser = launch_command_parser()
    args = parser.parse_args(argv)
    try:
        return launch_command(args)
    except (ConfigError, LaunchError) as error:
        print(f"hasten launch: error: {error}", file=sys.stderr)
        return 2 if isinstance(error, ConfigError) else 1


# Accelerate's launchers for TPU hosts and TPU pods (launch/tpu.py) and SageMaker jobs (refused in one line), at its path.
from ..launch.tpu import sagemaker_launcher, tpu_launcher, tpu_pod_launcher  # noqa: E402,F401

if __name__ == "__main__":
    sys.exit(main())
