"""Multi-machine launch: two `hasten launch` commands on this machine rendezvous through c10d and train together."""

import os
import re
import socket
import subprocess
import sys
from launching import SCRIPTS

SCRIPT = SCRIPTS / "config_two_machines.py"


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def clean_env(tmp_path, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HASTEN_", "ACCELERATE_", "SLURM_"))}
    env.update(HF_HOME=str(tmp_path / "hf"), PYTHONUNBUFFERED="1", **extra)
    return env


def run_together(commands_and_envs):
    """Start every command at once (they must meet), wait for all, return their outputs."""
    processes = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
                 for command, env in commands_and_envs]
    outputs = []
    try:
        for process in processes:
            out, err = process.communicate(timeout=240)
            assert process.returncode == 0, out + err
            outputs.append(out)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    return outputs


def trained_weights(outputs):
    weights = [re.search(r"WEIGHTS (\[.*?\])", out).group(1) for out in outputs]
    ranks = sorted(re.search(r"RANK (\d)", out).group(1) for out in outputs)
    assert ranks == ["0", "1"]  # one process on each side, one world of two
    assert weights[0] == weights[1]
    return weights[0]


def test_two_machines_train_together_through_c10d(tmp_path):
    port = free_port()
    runs = []
    for rank in (0, 1):
        command = [sys.executable, "-m", "hasten", "launch", "--cpu", "--num_machines", "2", "--num_processes", "2",
                   "--machine_rank", str(rank), "--main_process_ip", "127.0.0.1", "--main_process_port", str(port),
                   "--rdzv_backend", "c10d",
                   # Both "machines" are this host, so say which one hosts the rendezvous store.
                   "--rdzv_conf", f"is_host={1 - rank},join_timeout=120", str(SCRIPT)]
        runs.append((command, clean_env(tmp_path)))
    trained_weights(run_together(runs))


def test_inside_srun_no_flags_are_needed(tmp_path):
    """`srun --ntasks 2 hasten launch train.py`: each task is one process and finds its rank in SLURM_*."""
    port = str(free_port())
    runs = []
    for rank in (0, 1):
        slurm = dict(SLURM_PROCID=str(rank), SLURM_LOCALID=str(rank), SLURM_NODEID="0", SLURM_STEP_ID="0",
                     SLURM_NTASKS="2", SLURM_NNODES="1", SLURM_STEP_TASKS_PER_NODE="2",
                     SLURM_STEP_NODELIST="localhost", MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        runs.append(([sys.executable, "-m", "hasten", "launch", "--cpu", str(SCRIPT)], clean_env(tmp_path, **slurm)))
    trained_weights(run_together(runs))


def test_no_python_target(tmp_path):
    # (-m targets are covered by `hasten test`, which launches `-m hasten.commands.test`.)
    result = subprocess.run([sys.executable, "-m", "hasten", "launch", "--mixed_precision", "fp16", "--no_python",
                             "sh", "-c", "echo PROGRAM $HASTEN_MIXED_PRECISION $0", "arg0"], capture_output=True,
                            text=True, timeout=120, env=clean_env(tmp_path), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "PROGRAM fp16 arg0" in result.stdout
