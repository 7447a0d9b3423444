"""The launch plan: what `hasten launch` will start, resolved from the command line, the environment and the config
file (`plan_launch`), the rendezvous port it uses, and the command each process runs."""

from __future__ import annotations

import argparse
import socket
import sys
from dataclasses import dataclass, field

from ..core.errors import PortInUseError
from .machine import get_free_port


@dataclass
class LaunchPlan:
    """Everything needed to start the processes, resolved from flags, the environment and the config file."""

    num_processes: int = 1
    num_machines: int = 1
    machine_rank: int = 0
    main_process_ip: str = "127.0.0.1"
    main_process_port: int | None = None
    rdzv_backend: str = "static"
    rdzv_conf: dict = field(default_factory=dict)
    max_restarts: int = 0
    monitor_interval: float = 0.1
    env: dict = field(default_factory=dict)
    settings: object = None  # hasten.config.launch_settings.LaunchSettings: every value with its source

    @property
    def nproc_per_node(self) -> int:
        return self.num_processes // self.num_machines


def plan_launch(args: argparse.Namespace) -> LaunchPlan:
    """Resolve flags, environment and config file into a plan (precedence and checks: hasten.config)."""
    from ..config.launch_settings import resolve_launch

    settings = resolve_launch(args)
    values = {name: resolved.value for name, resolved in settings.values.items()}
    return LaunchPlan(
        num_processes=values["num_processes"],
        num_machines=values["num_machines"],
        machine_rank=values["machine_rank"],
        main_process_ip=values["main_process_ip"] or "127.0.0.1",
        main_process_port=values["main_process_port"],
        rdzv_backend=values["rdzv_backend"],
        rdzv_conf=settings.rdzv_conf,
        max_restarts=values["max_restarts"],
        monitor_interval=values["monitor_interval"],
        env=settings.env,
        settings=settings,
    )


def _port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("" if host in ("127.0.0.1", "localhost") else host, port))
        except OSError:
            return True
    return False


# Accelerate's words when the port is busy on a single machine (it then takes a free one, as hasten does)
PORT_IN_USE_WARNING = (
    "Port `{port}` is already in use. Accelerate will attempt to launch in a standalone-like mode by finding an open "
    "port automatically for this session. If this current attempt fails, or for more control in future runs, please "
    "specify a different port (e.g., `--main_process_port <your_chosen_port>`) or use `--main_process_port 0` for "
    "automatic selection in your launch command or Accelerate config file."
)


def _resolve_port(plan: LaunchPlan) -> int:
    """The rendezvous port, as Accelerate's launcher picks it: the one given, else 29500; 0 takes a free one. A busy
    port on the main machine is a warning and a free port on a single machine (an error in strict mode, when the
    port was given), and an error across several machines."""
    import warnings

    given = plan.main_process_port
    if given == 0:
        return get_free_port()
    port = 29500 if given is None else given
    if plan.machine_rank != 0 or plan.rdzv_backend != "static" or not _port_in_use(plan.main_process_ip, port):
        return port
    strict = bool(plan.settings is not None and plan.settings.values["strict"].value)
    if plan.num_machines == 1 and not (strict and given is not None):
        warnings.warn(PORT_IN_USE_WARNING.format(port=port), stacklevel=2)
        return get_free_port()
    raise PortInUseError(
        f"port {port} is already in use on this machine; pass another --main_process_port "
        "(or 0 to pick a free one on a single machine), or stop the process holding it"
    )


def _target_command(args) -> tuple[str, list[str]]:
    if args.no_python:
        return args.training_script, list(args.training_script_args)
    if args.module:
        return sys.executable, ["-u", "-m", args.training_script, *args.training_script_args]
    return sys.executable, ["-u", args.training_script, *args.training_script_args]


def _script_command(args) -> list:
    command = [] if args.no_python else [sys.executable, *(["-m"] if args.module else [])]
    return [*command, args.training_script, *args.training_script_args]


def flag_default(row):
    """The value a `hasten launch` flag reads when it is not typed: False for a switch, the row's default for a
    launcher option (`--tee`, `--role`, ...), else None or the parser default Accelerate gives it (a
    `ParserDefault`); the resolver reads each of those as "not typed". The parser (`commands/launch.py`) and
    `launch_defaults` both take it from here."""
    from ..config import settings as table

    if row.switch:
        return False
    if row.role == "option":
        return row.default
    return table.PARSER_DEFAULTS.get(row.name)


def launch_defaults() -> dict:
    """{argparse destination: value} of a `hasten launch` command line that names only a script."""
    from ..config import settings as table

    defaults = {row.flag_dest: flag_default(row) for row in table.SETTINGS if row.flags}
    return {**defaults, "training_script": "script.py", "training_script_args": []}


def _with_launch_defaults(args):
    """`args` with every `hasten launch` option it lacks set to the parser's default (callers, like Accelerate's
    own tests, build the Namespace by hand with Accelerate's fields only)."""
    for name, value in launch_defaults().items():
        if not hasattr(args, name):
            setattr(args, name, value)
        elif value is None and getattr(args, name) is False:
            setattr(args, name, None)  # an unset on/off flag, in hasten's terms ("not typed")
    return args
