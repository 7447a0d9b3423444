"""Multi-machine launch: two `hasten launch` commands on this machine rendezvous through c10d and train together."""

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parent / "distributed" / "config_two_machines.py"


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_two_machines_train_together_through_c10d(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HASTEN_", "ACCELERATE_"))}
    env.update(HF_HOME=str(tmp_path / "hf"), PYTHONUNBUFFERED="1")
    port = free_port()
    machines = []
    for rank in (0, 1):
        command = [sys.executable, "-m", "hasten", "launch", "--cpu", "--num_machines", "2", "--num_processes", "2",
                   "--machine_rank", str(rank), "--main_process_ip", "127.0.0.1", "--main_process_port", str(port),
                   "--rdzv_backend", "c10d",
                   # Both "machines" are this host, so say which one hosts the rendezvous store.
                   "--rdzv_conf", f"is_host={1 - rank},join_timeout=120", str(SCRIPT)]
        machines.append(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    outputs = []
    try:
        for machine in machines:
            out, err = machine.communicate(timeout=240)
            assert machine.returncode == 0, out + err
            outputs.append(out)
    finally:
        for machine in machines:
            if machine.poll() is None:
                machine.kill()
    weights = [re.search(r"WEIGHTS (\[.*?\])", out).group(1) for out in outputs]
    assert weights[0] == weights[1]
    ranks = sorted(re.search(r"RANK (\d)", out).group(1) for out in outputs)
    assert ranks == ["0", "1"]  # one process on each machine, one world of two


def test_module_and_no_python_targets(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HASTEN_", "ACCELERATE_"))}
    env.update(HF_HOME=str(tmp_path / "hf"), PYTHONPATH=str(tmp_path))
    (tmp_path / "my_entry.py").write_text("import os, sys\nprint('MODULE', sys.argv[1:], os.environ['HASTEN_MIXED_PRECISION'])\n")
    result = subprocess.run([sys.executable, "-m", "hasten", "launch", "--mixed_precision", "bf16", "-m", "my_entry",
                             "--lr", "1"], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "MODULE ['--lr', '1'] bf16" in result.stdout
    result = subprocess.run([sys.executable, "-m", "hasten", "launch", "--mixed_precision", "fp16", "--no_python",
                             "sh", "-c", "echo PROGRAM $HASTEN_MIXED_PRECISION"], capture_output=True, text=True,
                            timeout=120, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "PROGRAM fp16" in result.stdout
