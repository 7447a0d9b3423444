"""`hasten launch`: run a script on one process in place, or on many through torchrun's elastic agent.

The launcher turns flags into `HASTEN_*` environment variables that `hasten.state` reads in every process.
It never manages processes itself: more than one process always goes through
`torch.distributed.launcher.api.elastic_launch`, the engine behind `torchrun`.
"""

from __future__ import annotations

import argparse
import os
import runpy
import socket
import sys
import time
from dataclasses import dataclass, field

from ..errors import ConfigError, LaunchError

PRECISIONS = ("no", "fp16", "bf16", "fp8")
DYNAMO_BACKENDS = (
    "no", "eager", "aot_eager", "inductor", "aot_ts_nvfuser", "nvprims_nvfuser", "cudagraphs", "ofi", "fx2trt",
    "onnxrt", "tensorrt", "aot_torchxla_trace_once", "torchxla_trace_once", "tvm",
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


def _non_negative_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative; give 0 or more")
    return value


def _positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is {'negative' if value < 0 else 'not allowed'}; give 1 or more")
    return value


def _port(text):
    value = _non_negative_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a TCP port (0-65535)")
    return value


def _bool_text(text):
    from ..environment import str_to_bool

    try:
        return str_to_bool(text, to_bool=True)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def launch_command_parser(subparsers=None) -> argparse.ArgumentParser:
    description = "Launch a training script on one or more processes (and machines)."
    if subparsers is not None:
        parser = subparsers.add_parser("launch", description=description, allow_abbrev=False)
    else:
        parser = _Parser(prog="hasten launch", description=description, allow_abbrev=False)

    _add(parser, "--config_file", default=None, help="Config file to read defaults from.")
    _add(parser, "--quiet", "-q", action="store_true", help="Do not print the launcher's own error details.")
    _add(parser, "--module", "-m", action="store_true", help="Run the target as a Python module (python -m).")
    _add(parser, "--no_python", action="store_true", help="Execute the target directly, without `python`.")
    _add(parser, "--debug", action="store_true", help="Check shapes across ranks before collectives.")

    hardware = parser.add_argument_group("Hardware selection")
    _add(hardware, "--cpu", action="store_true", default=None, help="Run on CPU even if a GPU is present.")
    _add(hardware, "--multi_gpu", action="store_true", default=None, help="Distributed run on several GPUs.")
    _add(hardware, "--tpu", action="store_true", default=None, help=argparse.SUPPRESS)

    resources = parser.add_argument_group("Resource selection")
    _add(resources, "--mixed_precision", choices=PRECISIONS, default=None, help="Mixed precision mode.")
    _add(resources, "--num_processes", type=_positive_int, default=None, help="Total processes over all machines.")
    _add(resources, "--num_machines", type=_positive_int, default=None, help="Number of machines.")
    _add(resources, "--num_cpu_threads_per_process", type=_positive_int, default=None, help="OMP_NUM_THREADS.")
    _add(resources, "--enable_cpu_affinity", action="store_true", default=None, help="Pin processes to NUMA nodes.")
    _add(resources, "--dynamo_backend", choices=DYNAMO_BACKENDS, type=str.lower, default=None, help="torch.compile backend.")
    _add(resources, "--dynamo_mode", choices=("default", "reduce-overhead", "max-autotune"), default=None)
    _add(resources, "--dynamo_use_fullgraph", action="store_true", default=None)
    _add(resources, "--dynamo_use_dynamic", action="store_true", default=None)
    _add(resources, "--dynamo_use_regional_compilation", action="store_true", default=None)

    distributed = parser.add_argument_group("Distributed")
    _add(distributed, "--gpu_ids", default=None, help="Comma-separated GPU ids to use, or 'all'.")
    _add(distributed, "--same_network", action="store_true", default=None, help="Machines share a network.")
    _add(distributed, "--machine_rank", type=_non_negative_int, default=None, help="Rank of this machine.")
    _add(distributed, "--main_process_ip", default=None, help="Address of the machine with rank 0.")
    _add(distributed, "--main_process_port", type=_port, default=None, help="Port on the main machine (0: pick a free one).")
    _add(distributed, "--rdzv_backend", choices=("static", "c10d", "etcd", "etcd-v2"), default=None)
    _add(distributed, "--rdzv_conf", default=None, help="Extra rendezvous settings: key1=value1,key2=value2.")
    _add(distributed, "--max_restarts", type=_non_negative_int, default=None, help="Restarts before failing.")
    _add(distributed, "--monitor_interval", type=float, default=None, help="Seconds between health checks.")
    _add(distributed, "--tee", "-t", default="0", help=argparse.SUPPRESS)
    _add(distributed, "--log_dir", default=None, help="Directory for each process's logs.")
    _add(distributed, "--role", default="default", help=argparse.SUPPRESS)

    training = parser.add_argument_group("Training")
    _add(training, "--gradient_accumulation_steps", type=_positive_int, default=None)
    _add(training, "--use_fsdp", action="store_true", default=None)
    _add(training, "--use_deepspeed", action="store_true", default=None)
    _add(training, "--use_megatron_lm", action="store_true", default=None)

    parser.add_argument("training_script", help="The script (or module with -m) to run.")
    parser.add_argument("training_script_args", nargs=argparse.REMAINDER, help="Arguments for the script.")
    if subparsers is not None:
        parser.set_defaults(func=launch_command)
    return parser


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

    @property
    def nproc_per_node(self) -> int:
        return self.num_processes // self.num_machines


def _parse_rdzv_conf(text: str | None) -> dict:
    result = {}
    for item in filter(None, (text or "").split(",")):
        if "=" not in item:
            raise ConfigError(f"--rdzv_conf item {item!r} is not key=value (example: --rdzv_conf timeout=900,is_host=1)")
        key, value = item.split("=", 1)
        result[key.strip()] = value.strip()
    return result


def _gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:  # noqa: BLE001
        return 0


def plan_launch(args: argparse.Namespace) -> LaunchPlan:
    """Check the flags together and turn them into a plan; conflicting flags are errors, not warnings."""
    paradigms = [name for name in ("cpu", "multi_gpu", "tpu", "use_deepspeed", "use_fsdp") if getattr(args, name, None)]
    if len(paradigms) > 1:
        raise ConfigError(f"--{paradigms[0]} and --{paradigms[1]} cannot be combined: pick one way to run")
    if args.tpu:
        raise ConfigError("--tpu is not supported by hasten yet")
    if args.use_deepspeed or args.use_megatron_lm:
        flag = "--use_deepspeed" if args.use_deepspeed else "--use_megatron_lm"
        raise ConfigError(f"{flag} is not supported by hasten yet")
    if args.module and args.no_python:
        raise ConfigError("--module and --no_python cannot be combined")

    num_machines = args.num_machines or 1
    num_processes = args.num_processes
    if num_processes is None:
        gpus = 0 if args.cpu else _gpu_count()
        num_processes = max(1, gpus) * num_machines if not args.multi_gpu else max(2, gpus)
    if args.multi_gpu and num_processes < 2:
        raise ConfigError("--multi_gpu needs --num_processes of 2 or more")
    if num_processes % num_machines:
        raise ConfigError(
            f"--num_processes {num_processes} is the total over all machines and must divide evenly by "
            f"--num_machines {num_machines}"
        )
    machine_rank = args.machine_rank or 0
    if machine_rank >= num_machines:
        raise ConfigError(f"--machine_rank {machine_rank} must be below --num_machines {num_machines}")
    if num_machines > 1 and not args.main_process_ip:
        raise ConfigError(
            f"--num_machines {num_machines} needs --main_process_ip: the address of the machine with rank 0"
        )

    env = {}
    if args.cpu:
        env["HASTEN_USE_CPU"] = "true"
    if args.mixed_precision:
        env["HASTEN_MIXED_PRECISION"] = args.mixed_precision
    if args.debug:
        env["HASTEN_DEBUG_MODE"] = "true"
    if args.gradient_accumulation_steps:
        env["HASTEN_GRADIENT_ACCUMULATION_STEPS"] = str(args.gradient_accumulation_steps)
    if args.dynamo_backend:
        env["HASTEN_DYNAMO_BACKEND"] = args.dynamo_backend
        env["HASTEN_DYNAMO_MODE"] = args.dynamo_mode or "default"
        env["HASTEN_DYNAMO_USE_FULLGRAPH"] = str(bool(args.dynamo_use_fullgraph)).lower()
        env["HASTEN_DYNAMO_USE_REGIONAL_COMPILATION"] = str(bool(args.dynamo_use_regional_compilation)).lower()
        if args.dynamo_use_dynamic is not None:
            env["HASTEN_DYNAMO_USE_DYNAMIC"] = "true"
    if args.enable_cpu_affinity:
        env["HASTEN_CPU_AFFINITY"] = "1"
    if args.use_fsdp:
        env["HASTEN_USE_FSDP"] = "true"
    if args.gpu_ids and args.gpu_ids != "all":
        ids = [g.strip() for g in args.gpu_ids.split(",") if g.strip()]
        if not all(g.isdigit() for g in ids):
            raise ConfigError(f"--gpu_ids {args.gpu_ids!r} must be comma-separated integers (e.g. 0,1) or 'all'")
        env["CUDA_VISIBLE_DEVICES"] = ",".join(ids)
    nproc_per_node = num_processes // num_machines
    threads = args.num_cpu_threads_per_process
    if threads is None and "OMP_NUM_THREADS" not in os.environ:
        # Without this every process starts one thread per core and they fight for the same cores.
        import psutil

        threads = max(1, (psutil.cpu_count(logical=False) or 1) // nproc_per_node)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)

    return LaunchPlan(
        num_processes=num_processes,
        num_machines=num_machines,
        machine_rank=machine_rank,
        main_process_ip=args.main_process_ip or "127.0.0.1",
        main_process_port=args.main_process_port,
        rdzv_backend=args.rdzv_backend or "static",
        rdzv_conf=_parse_rdzv_conf(args.rdzv_conf),
        max_restarts=args.max_restarts or 0,
        monitor_interval=0.1 if args.monitor_interval is None else args.monitor_interval,
        env=env,
    )


def _port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("" if host in ("127.0.0.1", "localhost") else host, port))
        except OSError:
            return True
    return False


def get_free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def _resolve_port(plan: LaunchPlan) -> int:
    port = plan.main_process_port
    if port in (None, 0):
        # One machine: any free port will do, like `torchrun --standalone`. Several machines must agree.
        if plan.num_machines == 1 or port == 0:
            return get_free_port()
        return 29500
    if plan.machine_rank == 0 and plan.rdzv_backend == "static" and _port_in_use(plan.main_process_ip, port):
        raise LaunchError(
            f"port {port} is already in use on this machine; pass another --main_process_port "
            "(or 0 to pick a free one), or stop the process holding it"
        )
    return port


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
        if args.module:
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
        from ..state import PEER_LOSS_MARKERS  # torch is loaded by now

        # Files written by torch's own `@record` (function launchers) carry no flag: read the message.
        lost_peer = extra.get("hasten_peer_loss") or any(m in message.lower() for m in PEER_LOSS_MARKERS)
        rank_kind = 3 if lost_peer else 0
        if rank_kind == 3:
            what = "lost contact with a failed process"
        else:
            what = "failed: " + (message.strip().splitlines() or [""])[0][:300]
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
    consequence of losing a peer (see `hasten.state._record_uncaught_errors`).
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


def _logs_specs(args):
    if not args.log_dir and args.tee in (None, "0"):
        return None
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std

    return DefaultLogsSpecs(log_dir=args.log_dir, tee=Std.from_str(args.tee))


def _run_distributed(args, plan: LaunchPlan) -> int:
    import logging
    import uuid

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

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
    )
    entrypoint, entry_args = _target_command(args)
    started = time.monotonic()
    try:
        elastic_launch(config, entrypoint)(*entry_args)
    except ChildFailedError as error:
        if not args.quiet:
            elapsed = time.monotonic() - started
            print(
                f"hasten launch: {_describe_failures(error)} (after {elapsed:.1f}s; the failing process's own "
                "error is printed above)",
                file=sys.stderr,
            )
        return 1
    except Exception as error:  # noqa: BLE001 - rendezvous/agent errors: one line, not the agent's traceback
        if args.debug:
            raise
        text = (str(error).strip().splitlines() or [""])[0]
        print(f"hasten launch: error: the launcher's agent failed: {type(error).__name__}: {text} "
              "(run with --debug for the full trace)", file=sys.stderr)
        return 1
    return 0


def launch_command(args: argparse.Namespace) -> int:
    plan = plan_launch(args)
    if not args.no_python and not args.module and not os.path.exists(args.training_script):
        # Checked before torch is imported: the answer should not wait for it.
        raise LaunchError(f"training script {args.training_script!r} does not exist")
    if plan.num_processes == 1 and plan.num_machines == 1 and not plan.max_restarts:
        return _run_in_place(args, plan)
    return _run_distributed(args, plan)


def main(argv=None) -> int:
    parser = launch_command_parser()
    args = parser.parse_args(argv)
    try:
        return launch_command(args)
    except (ConfigError, LaunchError) as error:
        print(f"hasten launch: error: {error}", file=sys.stderr)
        return 2 if isinstance(error, ConfigError) else 1


if __name__ == "__main__":
    sys.exit(main())
