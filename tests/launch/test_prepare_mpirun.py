"""mpirun launching (`--mpirun_hostfile`, the file's `mpirun_config`): the command `prepare_simple_launcher_cmd_env`
composes for each MPI's spelling, and a real 2-process run when an MPI is installed (`pip install mpich`)."""

from __future__ import annotations

import os
import re
import shutil
import stat
import sys
from pathlib import Path
from unittest import mock

import pytest
import yaml

from hasten.commands.launch import launch_command_parser
from hasten.core.errors import ConfigError, LaunchError
from launching import launch


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # no default config file
    for name in [n for n in os.environ if n.startswith(("HASTEN_", "ACCELERATE_", "CCL_"))]:
        monkeypatch.delenv(name)
    return tmp_path


def fake_mpi(folder: Path, monkeypatch, version: str) -> None:
    """An `mpirun` on PATH that answers --version like the named MPI."""
    folder.mkdir(exist_ok=True)
    program = folder / "mpirun"
    program.write_text(f"#!/bin/sh\necho '{version}'\n")
    program.chmod(program.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", str(folder))


def command_env(*argv):
    from hasten.utils.launch import prepare_simple_launcher_cmd_env

    return prepare_simple_launcher_cmd_env(launch_command_parser().parse_args([*argv, "train.py", "--lr", "1"]))


@pytest.mark.parametrize("version, expected", [
    ("Intel(R) MPI Library for Linux* OS, Version 2021.10", ["mpirun", "-f", "hosts", "-ppn", "2", "-n", "4"]),
    ("HYDRA build details: Version: 5.0.2", ["mpirun", "-f", "hosts", "-ppn", "2", "-n", "4"]),  # MPICH, MVAPICH
    ("mpirun (Open MPI) 4.1.5", ["mpirun", "--hostfile", "hosts", "--npernode", "2", "-n", "4",
                                 "--bind-to", "socket"]),
])
def test_the_hostfile_flag_prepends_each_mpis_spelling(home, monkeypatch, version, expected):
    fake_mpi(home / "bin", monkeypatch, version)
    command, env = command_env("--cpu", "--mpirun_hostfile", "hosts", "--num_processes", "4", "--num_machines", "2",
                               "--main_process_ip", "10.0.0.1", "--main_process_port", "29511", "--mpirun_ccl", "3",
                               "--mixed_precision", "bf16")
    assert command == [*expected, sys.executable, "train.py", "--lr", "1"]
    assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["CCL_WORKER_COUNT"]) == ("10.0.0.1", "29511", "3")
    assert env["HASTEN_MIXED_PRECISION"] == "bf16" and env["KMP_BLOCKTIME"] == "1"


def test_the_files_mpirun_config_and_accelerates_patch_points(home, monkeypatch):
    config = home / "mpi.yaml"
    config.write_text(yaml.safe_dump({
        "distributed_type": "MULTI_CPU", "use_cpu": True, "num_machines": 4, "num_processes": 16,
        "main_process_ip": "127.0.0.1", "main_process_port": 0, "mpirun_config": {"mpirun_hostfile": "~/hostfile"}}))
    # Accelerate's own test patches these names on its utils.launch path: they reach the code
    with mock.patch("hasten.utils.launch.which", return_value=True), \
            mock.patch("hasten.utils.launch.subprocess.check_output", return_value=b"Intel MPI"):
        command, env = command_env("--config_file", str(config))
    assert command[:7] == ["mpirun", "-f", os.path.expanduser("~/hostfile"), "-ppn", "4", "-n", "16"]
    assert env["MASTER_ADDR"] == "127.0.0.1" and int(env["MASTER_PORT"]) > 0  # port 0: a free one
    # without a hostfile: no mpirun, and no MASTER_* for a one-process run
    command, env = command_env("--cpu")
    assert command[0] == sys.executable and env.get("MASTER_PORT") == os.environ.get("MASTER_PORT")


def test_mpirun_mistakes_are_one_line(home, monkeypatch):
    fake_mpi(home / "bin", monkeypatch, "HYDRA")
    with pytest.raises(ConfigError, match="--mpirun_ccl needs --mpirun_hostfile"):
        command_env("--cpu", "--mpirun_ccl", "2")
    with pytest.raises(ConfigError, match="starts CPU processes, but multi_gpu is on"):
        command_env("--multi_gpu", "--num_processes", "2", "--mpirun_hostfile", "hosts")
    monkeypatch.setenv("PATH", str(home / "empty"))
    monkeypatch.setattr(sys, "executable", str(home / "empty" / "python"))  # nor an mpirun beside this Python
    with pytest.raises(LaunchError, match="mpirun or mpiexec were not found") as caught:
        command_env("--cpu", "--mpirun_hostfile", "hosts")
    assert "\n" not in str(caught.value)


def _mpirun() -> str | None:
    """An mpirun on PATH, or beside this Python (the `mpich` wheel of the test extra installs it there)."""
    found = shutil.which("mpirun")
    beside = Path(sys.executable).parent / "mpirun"
    return found or (str(beside) if beside.is_file() else None)


@pytest.mark.skipif(_mpirun() is None, reason="no mpirun on PATH (pip install mpich)")
def test_two_processes_started_by_a_real_mpirun_train_together(home):
    hostfile = home / "hosts"
    hostfile.write_text("localhost\n")
    config = home / "mpi.yaml"
    config.write_text(yaml.safe_dump({"distributed_type": "MULTI_CPU", "use_cpu": True, "num_processes": 2,
                                      "mixed_precision": "no", "mpirun_config": {"mpirun_hostfile": str(hostfile),
                                                                                 "mpirun_ccl": 2}}))
    path = f"{Path(_mpirun()).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    result = launch("mpirun_ranks.py", num_processes=2, flags=["--config_file", str(config)],
                    env={"PATH": path, "HF_HOME": str(home / "hf")}, timeout=120)
    lines = sorted(re.findall(r"MPI [^\n]*?DistributedType\.\w+", result.stdout))
    assert lines == ["MPI 0 2 1 no 2 DistributedType.MULTI_CPU", "MPI 1 2 1 no 2 DistributedType.MULTI_CPU"], (
        result.stdout + result.stderr)
