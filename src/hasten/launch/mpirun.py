"""mpirun launching (`--mpirun_hostfile`, `mpirun_config`): the `mpirun ...` words that start the processes and the
variables they need. Each process then reads its rank from MPI's own variables (distributed/cluster.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from ..core.errors import ConfigError, LaunchError
from .machine import get_free_port


def get_mpirun_args(which=shutil.which) -> tuple:
    """(program, hostfile option, process-count option, processes-per-machine option, bind option) of the MPI
    found on PATH (`mpirun`, else `mpiexec`): Open MPI spells them --hostfile/-n/--npernode/--bind-to; Intel MPI,
    MPICH and MVAPICH -f/-n/-ppn and no bind option."""
    programs = [name for name in ("mpirun", "mpiexec") if which(name)]
    if not programs:  # `pip install mpich` into a virtual environment that is not activated
        beside = [os.path.join(os.path.dirname(sys.executable), name) for name in ("mpirun", "mpiexec")]
        programs = [path for path in beside if os.access(path, os.X_OK)]
    if not programs:
        raise LaunchError("mpirun or mpiexec were not found. Ensure that Intel MPI, Open MPI, or MVAPICH are "
                          "installed. (fix: put one on PATH, e.g. `pip install mpich`, or drop --mpirun_hostfile "
                          "to start the processes through torchrun)")
    version = subprocess.check_output([programs[0], "--version"])
    if b"Open MPI" in version:
        return programs[0], "--hostfile", "-n", "--npernode", "--bind-to"
    return programs[0], "-f", "-n", "-ppn", ""


def mpirun_prefix(plan, which=shutil.which) -> list:
    """The `mpirun ... ` words that start `plan`'s processes from its hostfile (empty without a hostfile)."""
    hostfile = plan.settings["mpirun_hostfile"] if plan.settings is not None else None
    if not hostfile:
        return []
    torchrun_only = [name for name in ("multi_gpu", "use_fsdp", "use_deepspeed", "use_megatron_lm")
                     if plan.settings[name]]
    if torchrun_only:
        raise ConfigError(f"mpirun_hostfile (from {plan.settings.values['mpirun_hostfile'].origin}) starts CPU "
                          f"processes, but {torchrun_only[0]} is on, which hasten starts through torchrun; fix: drop "
                          "the hostfile, or launch with --cpu (distributed_type: MULTI_CPU)")
    program, hostfile_option, count_option, per_node_option, bind_option = get_mpirun_args(which)
    command = [program, hostfile_option, os.path.expanduser(hostfile), per_node_option, str(plan.nproc_per_node),
               count_option, str(plan.num_processes)]
    return command + ([bind_option, "socket"] if bind_option else [])


def mpirun_env(plan) -> dict:
    """What the mpirun-started processes need beside the run's settings: where rank 0 listens (each process reads
    its rank from MPI's own variables, PMI_RANK / OMPI_COMM_WORLD_RANK / MV2_COMM_WORLD_RANK)."""
    if plan.num_processes == 1 and plan.num_machines == 1:
        return {}
    # Rank 0 runs on the hostfile's first machine, maybe not this one: the port is not checked here. Port 0 (or
    # none on one machine) takes a free one; several machines without a port use 29500, as Accelerate.
    port = plan.main_process_port
    if not port:
        port = get_free_port() if plan.num_machines == 1 or port == 0 else 29500
    return {"MASTER_ADDR": plan.main_process_ip, "MASTER_PORT": str(port)}
