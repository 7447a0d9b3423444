"""`hasten config explain [launch flags]`: every value `hasten launch` would use, and where it comes from.

The values come from the same resolution the launcher runs (hasten.config.launch_settings.resolve_launch), and the
training processes read them back through the same precedence (hasten.config.resolve.runtime_value), so what this
prints is what the script's Accelerator uses, except for values the script itself passes in code.
"""

from __future__ import annotations

import sys

from .config_utils import _Parser

description = "Show every value `hasten launch` would use with these flags, and where it comes from."
CODE_NOTE = ("Values set in code (Accelerator(...) arguments) beat all of these; they are only known inside the "
             "script: call hasten.config.resolve.explain(code={...}) there.")


def explain_command_parser(parser=None, parents=()):
    from ..launch import add_launch_arguments

    if parser is None:
        sub = _Parser(prog="hasten config explain", allow_abbrev=False, description=description)
    else:
        sub = parser.add_parser("explain", parents=list(parents), description=description, allow_abbrev=False)
    add_launch_arguments(sub)
    sub.add_argument("--all", action="store_true", help="Also list settings left at their built-in default.")
    sub.add_argument("--plan", action="store_true",
                     help="Also print the run plan these values make: backend, distributed type, plugins, mesh, "
                          "precision and accumulation (for a script that passes nothing in code).")
    sub.set_defaults(func=explain_command)
    return sub


def explain_command(args) -> int:
    from ...config.launch_settings import LAUNCHER_DEFAULT, resolve_launch

    settings = resolve_launch(args)
    values = {k: v for k, v in settings.values.items()
              if args.all or v.source != "default" or v.origin.startswith(LAUNCHER_DEFAULT)}
    exported = {k: v for k, v in settings.env.items() if k != "HASTEN_CONFIG_SOURCES"}
    print(f"config file: {settings.config_path or 'none found'}")
    if not _print_rich(values):
        from ...config.resolve import format_explanation

        print(format_explanation(values))
    print("\n" + CODE_NOTE)
    if exported:
        print("\nexported to the training processes: " + " ".join(f"{k}={v}" for k, v in sorted(exported.items())))
    if args.plan:
        print("\nrun plan (what Accelerator() decides from these values; arguments in code change it):")
        print("\n".join("  " + line for line in run_plan(settings).describe()))
    return 0


def run_plan(settings):
    """The plan `hasten.plan.make_run_plan` makes in the training processes from these launch settings:
    the same function, reading the variables the launcher exports, with the process count the launch starts."""
    from ...plan import Cluster, make_run_plan
    from ...distributed.cluster import detect_device_type, distributed_type_for
    from ...launch.machine import patch_environment

    processes = settings["num_processes"] or 1
    with patch_environment(**settings.env):
        device_type = detect_device_type(bool(settings["use_cpu"]))
        detected = Cluster(processes, device_type, distributed_type_for(device_type, processes, processes > 1))
        return make_run_plan(cluster=lambda _fsdp_plugin: detected)


def _print_rich(values) -> bool:
    """A boxed table on a terminal when `rich` is installed; False (print plain text) otherwise or when piped."""
    if not sys.stdout.isatty():
        return False
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        return False
    from ...config.resolve import _text

    table = Table("setting", "value", "source", "from", title="hasten config explain")
    for resolved in values.values():
        value = "-" if resolved.value is None else _text(resolved.value)
        table.add_row(resolved.name, value, resolved.source, resolved.origin)
    Console().print(table)
    return True
