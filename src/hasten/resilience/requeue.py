"""The launcher's side of preemption: which exit code says "start me again", and SLURM's requeue.

Standard library only: `hasten launch` reads it before torch is imported. The worker's side (the signal
handler and the checkpoint at the step boundary) is `hasten.resilience.preemption`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

# sysexits.h EX_TEMPFAIL: "a temporary failure; the user is invited to retry". Not 128+n, which a shell reports
# for a process *killed* by signal n (no checkpoint written), and not 1, which any error gives.
PREEMPTED_EXIT_CODE = 75

# Signals that ask a run to checkpoint and stop: SLURM and Kubernetes send SIGTERM before killing a job or pod,
# SLURM sends SIGUSR1 ahead of the time limit when asked (`--signal=USR1@<seconds>`).
PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

# torchrun's agent forwards to the workers only the signals it handles (`LaunchConfig.signals_to_handle`, torchrun's
# --signals_to_handle); SIGUSR1 is not among its defaults and would kill the agent, leaving the workers running.
AGENT_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"


def exit_code_for_signal(signum: int) -> int:
    """The launcher's exit code after the agent stopped the workers because the launcher got `signum`."""
    if signum in PREEMPTION_SIGNALS:
        return PREEMPTED_EXIT_CODE
    return 128 + int(signum)  # what a shell reports for a process stopped by that signal (Ctrl-C: 130)


def all_preempted(exit_codes) -> bool:
    """True when the workers stopped for preemption: one or more left with PREEMPTED_EXIT_CODE and the others
    with it too or by the SIGTERM the agent sends to the rest of the group (no process failed on its own)."""
    codes = list(exit_codes)
    return PREEMPTED_EXIT_CODE in codes and all(c in (PREEMPTED_EXIT_CODE, -signal.SIGTERM) for c in codes)


def requeue_slurm_job(machine_rank: int) -> None:
    """`scontrol requeue $SLURM_JOB_ID` from the first machine, when running under SLURM (else nothing)."""
    job = os.environ.get("SLURM_JOB_ID")
    if not job or machine_rank != 0:
        return
    try:
        result = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        print(f"hasten launch: could not requeue SLURM job {job}: {error}", file=sys.stderr)
        return
    if result.returncode != 0:
        print(f"hasten launch: scontrol requeue {job} failed: {result.stderr.strip() or result.stdout.strip()}",
              file=sys.stderr)
    else:
        print(f"hasten launch: requeued SLURM job {job}", file=sys.stderr)
