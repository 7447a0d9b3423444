"""`hasten launch`: run a script on one process in place, or on many through torchrun's elastic agent.

The launcher turns flags into `HASTEN_*` environment variables that `hasten.state` reads in every process.
It never manages processes itself: more than one process always goes through
`torch.distributed.launcher.api.elastic_launch`, the engine behind `torchrun`.
"""

from __future__ import annotations

import argparse
import copy
import os
import runpy
import signal
import socket
import sys
import time
from dataclasses import dataclass, field

from ..core.errors import ConfigError, LaunchError
from ..distributed.cluster import parse_bool, parse_int
from ..launch.machine import get_free_port


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
        kwargs = {"dest": row.flag_dest, "help": argparse.SUPPRESS if row.hidden else row.help}
        if row.role == "option":
            kwargs["default"] = row.default
        else:
            kwargs["default"] = table.PARSER_DEFAULTS.get(row.name)  # None: "not typed"
        if row.switch:
            # an untyped switch reads False, as in Accelerate's parser (code tests `args.multi_gpu is False`);
            # the resolver reads False from a switch as "not typed", so the file and the environment still apply
            kwargs["action"] = "store_true"
            kwargs["default"] = False
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


@dataclass
class LaunchPlan:
    """Everything needed to start the processes, resolved from flags (and, later, the config file)."""

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


class PortInUseError(LaunchError, ConnectionError):
    """The rendezvous port is taken (a ConnectionError, as Accelerate's launcher raises there)."""


def _target_command(args) -> tuple[str, list[str]]:
    if args.no_python:
        return args.training_script, list(args.training_script_args)
    if args.module:
        return sys.executable, ["-u", "-m", args.training_script, *args.training_script_args]
    return sys.executable, ["-u", args.training_script, *args.training_script_args]


def _run_in_place(args, plan: LaunchPlan) -> int:
    """One process: run the script in this interpreter (torch is already imported; no second start-up)."""
    os.environ.update(plan.env)
    if args.no_python:
        os.execvp(args.training_script, [args.training_script, *args.training_script_args])
    if not args.module and not os.path.exists(args.training_script):
        raise LaunchError(f"training script {args.training_script!r} does not exist")
    sys.argv = [args.training_script, *args.training_script_args]
    try:
        if args.module:  # as `python -m`: the module is looked up from the working directory first
            sys.path.insert(0, os.getcwd())
            runpy.run_module(args.training_script, run_name="__main__", alter_sys=True)
        else:
            sys.path.insert(0, os.path.dirname(os.path.abspath(args.training_script)))
            runpy.run_path(args.training_script, run_name="__main__")
    except SystemExit as exit_:
        code = exit_.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    return 0


def _failure_facts(failure) -> tuple[int, float, str]:
    """(how likely this failure is the root cause: lower first, when it happened, what happened)."""
    extra = {}
    message = failure.message if isinstance(failure.message, str) else ""
    data = failure.error_file_data.get("message") if isinstance(failure.error_file_data, dict) else None
    if isinstance(data, dict):
        message = str(data.get("message", ""))
        extra = data.get("extraInfo", {}) or {}
    code = failure.exitcode
    when = float(extra.get("hasten_time", failure.timestamp))
    if extra:
        from ..resilience.error_file import PEER_LOSS_MARKERS  # torch is loaded by now

        # Files written by torch's own `@record` (function launchers) carry no flag: read the message.
        lost_peer = extra.get("hasten_peer_loss") or any(m in message.lower() for m in PEER_LOSS_MARKERS)
        if lost_peer and extra.get("hasten_report"):
            # The doctor's diagnosis outranks a survivor the agent sent SIGTERM to (a rank that was still
            # leaving, e.g. after returning early, when the doctor stopped this one).
            rank_kind, what = 1, "was stopped by debug mode's hang doctor (report below)"
        elif lost_peer:
            rank_kind, what = 3, "lost contact with a failed process"
        else:
            rank_kind, what = 0, "failed: " + (message.strip().splitlines() or [""])[0][:300]
    elif code is not None and code < 0:
        what = f"was killed by signal {-code}"
        # SIGTERM is what the agent sends to the survivors; other signals (KILL by the OOM killer, SEGV,
        # ABRT) are failures of their own.
        rank_kind = 2 if -code == 15 else 1
    else:
        what = f"exited with code {code}"
        rank_kind = 1
    return rank_kind, when, what


def _describe_failures(error) -> str:
    """One line naming the rank that failed first, then what happened to the others.

    The agent's own order is unreliable: when rank 1 dies, rank 0 often fails inside a collective and exits
    before rank 1 has finished dying. Error files written by hasten's workers say which error was a
    consequence of losing a peer (see `hasten.resilience.error_file.record_uncaught_errors`).
    """
    failures = getattr(error, "failures", {}) or {}
    if not failures:
        return str(error).strip().splitlines()[0] if str(error).strip() else "a process failed"
    facts = {rank: _failure_facts(failure) for rank, failure in failures.items()}
    order = sorted(facts, key=lambda rank: (facts[rank][0], facts[rank][1], rank))
    root = order[0]
    parts = [f"rank {root} (local rank {failures[root].local_rank}) {facts[root][2]}"]
    later = [
        f"rank {rank} " + ("the same way" if facts[rank][2] == facts[root][2] else facts[rank][2])
        for rank in order[1:] if facts[rank][0] != 2
    ]
    if later:
        parts.append("then " + ", ".join(later))
    stopped = [str(rank) for rank in order[1:] if facts[rank][0] == 2]
    if stopped:
        parts.append(f"rank{'s' if len(stopped) > 1 else ''} {', '.join(stopped)} stopped by the launcher")
    return "; ".join(parts)


def _hang_report(error) -> str | None:
    """The hang doctor's report (debug mode) from the failed workers' error files: the root failure's first."""
    from ..resilience.hang_doctor import REPORT_KEY

    failures = getattr(error, "failures", {}) or {}
    reports = []
    for rank, failure in sorted(failures.items()):
        data = failure.error_file_data.get("message") if isinstance(failure.error_file_data, dict) else None
        extra = data.get("extraInfo", {}) if isinstance(data, dict) else {}
        report = (extra or {}).get(REPORT_KEY)
        if report:
            reports.append((bool(extra.get("hasten_peer_loss")), rank, report))
    return min(reports)[2] if reports else None


def _logs_specs(args):
    if not args.log_dir and args.tee in (None, "0"):
        return None
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std

    return DefaultLogsSpecs(log_dir=args.log_dir, tee=Std.from_str(args.tee))


def _agent_signals() -> dict:
    """With `handle_preemption`: the agent passes these signals (its defaults and SIGUSR1) on to the workers,
    waits up to TORCH_ELASTIC_SHUTDOWN_TIMEOUT (30 s) for them to checkpoint and leave, then raises SignalException
    here (docs/fault_tolerance.md). Older torch (2.6) has no such field: its agent forwards
    SIGTERM/SIGINT/SIGHUP/SIGQUIT only (not SIGUSR1)."""
    import dataclasses

    from torch.distributed.launcher.api import LaunchConfig

    from ..resilience import requeue

    names = {f.name for f in dataclasses.fields(LaunchConfig)}
    return {"signals_to_handle": requeue.AGENT_SIGNALS} if "signals_to_handle" in names else {}


def _run_distributed(args, plan: LaunchPlan) -> int:
    import logging
    import uuid

    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from ..resilience import requeue

    if not args.debug:
        # The agent's chatter (and its guess at the failed rank, often wrong) buries the user's own output;
        # the one-line summary below replaces it.
        # torch gives each of its modules' loggers an explicit level, so setting the parent is not enough.
        for name in ["torch.distributed.elastic", *logging.root.manager.loggerDict]:
            if name.startswith(("torch.distributed.elastic", "torch.distributed.launcher")):
                logging.getLogger(name).setLevel(logging.CRITICAL)
    if not args.no_python and not args.module and not os.path.exists(args.training_script):
        raise LaunchError(f"training script {args.training_script!r} does not exist")
    port = _resolve_port(plan)
    # hasten's side of preemption (exit codes 75 / 128+n, SIGUSR1 passed on, SLURM requeue) is opt-in; off, the
    # launcher behaves as Accelerate's: torch's agent handles its default signals and a stopped run exits 1.
    preemption = bool(plan.settings is not None and plan.settings.values["handle_preemption"].value)
    os.environ.update(plan.env)
    rdzv_configs = dict(plan.rdzv_conf)
    if plan.rdzv_backend == "static":
        rdzv_configs["rank"] = plan.machine_rank
    config = LaunchConfig(
        min_nodes=plan.num_machines,
        max_nodes=plan.num_machines,
        nproc_per_node=plan.nproc_per_node,
        run_id=rdzv_configs.pop("id", None) or ("none" if plan.num_machines > 1 else str(uuid.uuid4())),
        role=args.role,
        rdzv_endpoint=f"{plan.main_process_ip}:{port}",
        rdzv_backend=plan.rdzv_backend,
        rdzv_configs=rdzv_configs,
        max_restarts=plan.max_restarts,
        monitor_interval=plan.monitor_interval,
        start_method="spawn",
        logs_specs=_logs_specs(args),
        **(_agent_signals() if preemption else {}),
    )
    entrypoint, entry_args = _target_command(args)
    # Debug mode's hang doctor leaves its report in the workers' error files for the launcher to print, once.
    from ..resilience.hang_doctor import LAUNCHER_VARIABLE

    os.environ[LAUNCHER_VARIABLE] = "1"
    started = time.monotonic()
    try:
        elastic_launch(config, entrypoint)(*entry_args)
    except SignalException as error:
        if not preemption:
            print(f"hasten launch: stopped by {error.sigval.name} after {time.monotonic() - started:.1f}s; exit code 1 "
                  "(--handle_preemption: exit 75 after a preemption signal, to start the run again)", file=sys.stderr)
            return 1
        code = requeue.exit_code_for_signal(error.sigval)
        hint = " (preempted: start the run again to resume)" if code == requeue.PREEMPTED_EXIT_CODE else ""
        print(f"hasten launch: stopped by {error.sigval.name} after {time.monotonic() - started:.1f}s; exit code "
              f"{code}{hint}", file=sys.stderr)
        if error.sigval == signal.SIGUSR1:  # SLURM's warning ahead of the time limit: put the job back in the queue
            requeue.requeue_slurm_job(plan.machine_rank)
        return code
    except ChildFailedError as error:
        if preemption and requeue.all_preempted(f.exitcode for f in (getattr(error, "failures", {}) or {}).values()):
            print(f"hasten launch: the workers checkpointed and stopped after a preemption signal; exit code "
                  f"{requeue.PREEMPTED_EXIT_CODE} (start the run again to resume)", file=sys.stderr)
            return requeue.PREEMPTED_EXIT_CODE
        if not args.quiet:
            elapsed = time.monotonic() - started
            print(
                f"hasten launch: {_describe_failures(error)} (after {elapsed:.1f}s; the failing process's own "
                "error is printed above)",
                file=sys.stderr,
            )
            report = _hang_report(error)
            if report:
                print(report, file=sys.stderr, flush=True)
        return 1
    except Exception as error:  # noqa: BLE001 - rendezvous/agent errors: one line, not the agent's traceback
        if args.debug:
            raise
        text = (str(error).strip().splitlines() or [""])[0]
        print(f"hasten launch: error: the launcher's agent failed: {type(error).__name__}: {text} "
              "(run with --debug for the full trace)", file=sys.stderr)
        return 1
    return 0


def _with_launch_defaults(args):
    """`args` with every `hasten launch` option it lacks set to the parser's default (callers, like Accelerate's
    own tests, build the Namespace by hand with Accelerate's fields only)."""
    defaults = vars(launch_command_parser().parse_args(["script.py"]))
    for name, value in defaults.items():
        if not hasattr(args, name):
            setattr(args, name, value)
        elif value is None and getattr(args, name) is False:
            setattr(args, name, None)  # an unset on/off flag, in hasten's terms ("not typed")
    return args


def _script_command(args) -> list:
    command = [] if args.no_python else [sys.executable, *(["-m"] if args.module else [])]
    return [*command, args.training_script, *args.training_script_args]


def simple_launcher(args: argparse.Namespace) -> None:
    """Accelerate's one-process launcher: run the script as a child process with the launch's environment
    (`prepare_simple_launcher_cmd_env`). A non-zero exit raises `subprocess.CalledProcessError` (with `--quiet`:
    `sys.exit(1)`)."""
    import subprocess

    args = _with_launch_defaults(args)
    plan = plan_launch(args)  # as prepare_simple_launcher_cmd_env: the command and the run's environment
    command, env = _script_command(args), {**os.environ, **plan.env}
    process = subprocess.Popen(command, env=env)
    process.wait()
    if process.returncode != 0:
        if getattr(args, "quiet", False):
            sys.exit(1)
        raise subprocess.CalledProcessError(returncode=process.returncode, cmd=command)


def multi_gpu_launcher(args: argparse.Namespace) -> None:
    """Accelerate's torchrun launcher: start the processes through torchrun's elastic agent exactly as
    `hasten launch` does (any device type, gloo on CPUs). A failed run raises `LaunchError` naming the exit code
    (the failing ranks are printed above it)."""
    args = _with_launch_defaults(args)
    code = _run_distributed(args, plan_launch(args))
    if code != 0:
        raise LaunchError(f"the launched processes failed (exit code {code}); the failing ranks are named above")


def deepspeed_launcher(args: argparse.Namespace) -> None:
    """Accelerate's DeepSpeed launcher. hasten starts DeepSpeed's processes through torchrun like every other
    backend (on each machine, with --num_machines/--machine_rank), so this is `multi_gpu_launcher` with
    `use_deepspeed` on; DeepSpeed's own pdsh/hostfile launchers are refused when the launch is resolved."""
    args.use_deepspeed = True
    multi_gpu_launcher(args)


def _run_mpirun(args, plan: LaunchPlan) -> int:
    """An mpirun hostfile was given: mpirun starts the processes, each reads its rank from MPI's variables."""
    import subprocess

    from ..launch.mpirun import mpirun_env, mpirun_prefix

    command = mpirun_prefix(plan) + _script_command(args)
    return subprocess.call(command, env={**os.environ, **plan.env, **mpirun_env(plan)})


def launch_command(args: argparse.Namespace) -> int:
    plan = plan_launch(args)
    if not args.no_python and not args.module and not os.path.exists(args.training_script):
        # Checked before torch is imported: the answer should not wait for it.
        raise LaunchError(f"training script {args.training_script!r} does not exist")
    if plan.settings["mpirun_hostfile"]:
        return _run_mpirun(args, plan)
    if plan.settings["tpu"]:  # xmp.spawn on this host, or gcloud on every worker of a pod (launch/tpu.py)
        from ..launch import tpu

        saved_env, saved_argv = dict(os.environ), list(sys.argv)
        try:
            return tpu.launch(args, plan)
        finally:
            os.environ.clear()
            os.environ.update(saved_env)
            sys.argv = saved_argv
    # The run's variables go into this process's environment (the script runs in place, or torchrun's workers
    # inherit them); afterwards the caller's environment and argv are back, as after Accelerate's child process.
    saved_env, saved_argv = dict(os.environ), list(sys.argv)
    try:
        if plan.num_processes == 1 and plan.num_machines == 1 and not plan.max_restarts:
            return _run_in_place(args, plan)
        return _run_distributed(args, plan)
    finally:
        if dict(os.environ) != saved_env:
            os.environ.clear()
            os.environ.update(saved_env)
        sys.argv = saved_argv


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
