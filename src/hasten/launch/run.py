"""Running a launch plan: one process in place, many through torchrun's elastic agent (or mpirun), and the
one-line report of which rank failed first.

The launcher never manages processes itself: more than one process always goes through
`torch.distributed.launcher.api.elastic_launch`, the engine behind `torchrun`.
"""

from __future__ import annotations

import argparse
import os
import runpy
import signal
import sys
import time

from ..core.errors import LaunchError
from .plan import LaunchPlan, _resolve_port, _script_command, _target_command, _with_launch_defaults, plan_launch

def run(args, plan: LaunchPlan) -> int:
    """Start what `plan` describes for the script in `args` and wait for it; returns the exit code.

    One process runs the script in this interpreter; more go through torchrun's elastic agent, or through mpirun
    when the plan names a hostfile. The run's variables go into this process's environment (the script runs in
    place, or torchrun's workers inherit them); afterwards the caller's environment and argv are back, as after
    Accelerate's child process."""
    if not args.no_python and not args.module and not os.path.exists(args.training_script):
        # Checked before torch is imported: the answer should not wait for it.
        raise LaunchError(f"training script {args.training_script!r} does not exist")
    if plan.settings["mpirun_hostfile"]:
        return _run_mpirun(args, plan)
    saved_env, saved_argv = dict(os.environ), list(sys.argv)
    if plan.settings["tpu"]:  # xmp.spawn on this host, or gcloud on every worker of a pod (launch/tpu.py)
        from . import tpu

        try:
            return tpu.launch(args, plan)
        finally:
            os.environ.clear()
            os.environ.update(saved_env)
            sys.argv = saved_argv
    try:
        if plan.num_processes == 1 and plan.num_machines == 1 and not plan.max_restarts:
            return _run_in_place(args, plan)
        return _run_distributed(args, plan)
    finally:
        if dict(os.environ) != saved_env:
            os.environ.clear()
            os.environ.update(saved_env)
        sys.argv = saved_argv


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


def _run_mpirun(args, plan: LaunchPlan) -> int:
    """An mpirun hostfile was given: mpirun starts the processes, each reads its rank from MPI's variables."""
    import subprocess

    from ..launch.mpirun import mpirun_env, mpirun_prefix

    command = mpirun_prefix(plan) + _script_command(args)
    return subprocess.call(command, env={**os.environ, **plan.env, **mpirun_env(plan)})


def _run_distributed(args, plan: LaunchPlan) -> int:
    import logging
    import uuid

    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig

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
    from ..resilience.hang_verdict import LAUNCHER_VARIABLE

    os.environ[LAUNCHER_VARIABLE] = "1"
    from ..resilience.orphans import launcher_environment  # workers end with this process (resilience/orphans.py)

    os.environ.update(launcher_environment())
    started = time.monotonic()
    try:
        _start_workers(config, entrypoint, entry_args)
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


def _start_workers(config, entrypoint: str, entry_args: list) -> None:
    """Start the worker processes through torchrun's elastic agent and watch them until they all finish: the one
    place processes are started for a launch (raises what the agent raises: ChildFailedError, SignalException)."""
    from torch.distributed.launcher.api import elastic_launch

    elastic_launch(config, entrypoint)(*entry_args)


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


# -- the one-line failure report ------------------------------------------------------------------------------------
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
    from ..resilience.hang_verdict import REPORT_KEY

    failures = getattr(error, "failures", {}) or {}
    reports = []
    for rank, failure in sorted(failures.items()):
        data = failure.error_file_data.get("message") if isinstance(failure.error_file_data, dict) else None
        extra = data.get("extraInfo", {}) if isinstance(data, dict) else {}
        report = (extra or {}).get(REPORT_KEY)
        if report:
            reports.append((bool(extra.get("hasten_peer_loss")), rank, report))
    return min(reports)[2] if reports else None


# -- Accelerate's launchers (`accelerate.commands.launch.*_launcher`) -----------------------------------------------
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
