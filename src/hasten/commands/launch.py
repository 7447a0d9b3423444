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
    add_launch_arguments(parser)
    parser.add_argument("training_script", help="The script (or module with -m) to run.")
    parser.add_argument("training_script_args", nargs=argparse.REMAINDER, help="Arguments for the script.")
    if subparsers is not None:
        parser.set_defaults(func=launch_command)
    return parser


def add_launch_arguments(parser) -> None:
    """Every launch flag except the script (`hasten config explain` takes the same flags)."""
    # Settings flags default to None so that "not typed" is known: the environment and the config file
    # only fill settings whose flag was not typed.
    _add(parser, "--config_file", default=None, help="Config file to read (default: $HF_HOME/hasten/default_config.yaml).")
    _add(parser, "--quiet", "-q", action="store_true", help="Do not print the launcher's own error details.")
    _add(parser, "--module", "-m", action="store_true", help="Run the target as a Python module (python -m).")
    _add(parser, "--no_python", action="store_true", help="Execute the target directly, without `python`.")
    _add(parser, "--debug", action="store_true", default=None, help="Check shapes across ranks before collectives.")

    hardware = parser.add_argument_group("Hardware selection")
    _add(hardware, "--cpu", action="store_true", default=None, help="Run on CPU even if a GPU is present.")
    _add(hardware, "--multi_gpu", action="store_true", default=None, help="Distributed run on several GPUs.")
    _add(hardware, "--tpu", action="store_true", default=None, help=argparse.SUPPRESS)

    resources = parser.add_argument_group("Resource selection")
    _add(resources, "--mixed_precision", choices=PRECISIONS, type=str.lower, default=None, help="Mixed precision mode.")
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
    _add(distributed, "--monitor_interval", type=_non_negative_float, default=None, help="Seconds between health checks.")
    _add(distributed, "--tee", "-t", default="0", help=argparse.SUPPRESS)
    _add(distributed, "--log_dir", default=None, help="Directory for each process's logs.")
    _add(distributed, "--role", default="default", help=argparse.SUPPRESS)

    training = parser.add_argument_group("Training paradigm")
    _add(training, "--gradient_accumulation_steps", type=_positive_int, default=None)
    _add(training, "--use_fsdp", action="store_true", default=None, help="Shard the model with FSDP.")
    _add(training, "--use_deepspeed", action="store_true", default=None, help="DeepSpeed (not supported yet).")
    _add(training, "--use_megatron_lm", action="store_true", default=None, help=argparse.SUPPRESS)

    fsdp = parser.add_argument_group("FSDP (with --use_fsdp; exported as FSDP_* variables)")
    _add(fsdp, "--fsdp_version", type=int, choices=(1, 2), default=None)
    _add(fsdp, "--fsdp_offload_params", type=_bool_text, default=None, help="true/false")
    _add(fsdp, "--fsdp_min_num_params", type=_non_negative_int, default=None)
    _add(fsdp, "--fsdp_sharding_strategy", type=str.upper, default=None,
         choices=("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2"))
    _add(fsdp, "--fsdp_reshard_after_forward", type=_bool_or_strategy, default=None, help="true/false")
    _add(fsdp, "--fsdp_auto_wrap_policy", type=str.upper, default=None,
         choices=("TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP"))
    _add(fsdp, "--fsdp_transformer_layer_cls_to_wrap", default=None, help="Layer class names, comma-separated.")
    _add(fsdp, "--fsdp_backward_prefetch", type=str.upper, default=None,
         choices=("BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH"))
    _add(fsdp, "--fsdp_state_dict_type", type=str.upper, default=None,
         choices=("FULL_STATE_DICT", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT"))
    for name in ("forward_prefetch", "use_orig_params", "cpu_ram_efficient_loading", "sync_module_states",
                 "activation_checkpointing", "activation_checkpointing_offload"):
        _add(fsdp, f"--fsdp_{name}", type=_bool_text, default=None, help="true/false")

    deepspeed = parser.add_argument_group("DeepSpeed (accepted for compatibility; hasten does not run DeepSpeed yet)")
    for name in ("deepspeed_config_file", "zero_stage", "offload_optimizer_device", "offload_param_device",
                 "offload_optimizer_nvme_path", "offload_param_nvme_path", "gradient_clipping", "zero3_init_flag",
                 "zero3_save_16bit_model", "deepspeed_hostfile", "deepspeed_exclusion_filter",
                 "deepspeed_inclusion_filter", "deepspeed_multinode_launcher", "deepspeed_moe_layer_cls_names"):
        _add(deepspeed, f"--{name}", default=None, help=argparse.SUPPRESS)


def _non_negative_float(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{value} is negative; give 0 or more")
    return value


def _bool_or_strategy(text):
    upper = text.strip().upper()
    if upper in ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2"):
        return upper
    return _bool_text(text)


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
