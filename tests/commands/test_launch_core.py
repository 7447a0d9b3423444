"""`hasten launch`: bad command lines, busy ports, failing ranks, restarts and clean exits, in real processes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from launching import SCRIPTS, launch

FAILURES = SCRIPTS / "core_failures.py"


def hasten_launch(*argv, timeout=120, env=None):
    """Run `python -m hasten launch ARGV` and return the CompletedProcess (text)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("HASTEN_", "ACCELERATE_"))}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "hasten", "launch", *map(str, argv)], capture_output=True,
                          text=True, timeout=timeout, env=full_env)


def launcher_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("hasten launch")]


# -- bad command lines: one line, no traceback, before anything starts ------------------------------------------

@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--no_such_flag", "x.py"], "unrecognized arguments: --no_such_flag"),
        (["--num_processes", "-2", "x.py"], "-2 is negative"),
        (["--num_processes", "0", "x.py"], "0 is not allowed; give 1 or more"),
        (["--num_processes", "two", "x.py"], "'two' is not an integer"),
        (["--main_process_port", "70000", "x.py"], "not a TCP port"),
        (["--num_processes", "3", "--num_machines", "2", "--main_process_ip", "10.0.0.1", "x.py"], "divide evenly"),
        (["--num_processes", "2", "/no/such/script.py"], "does not exist"),
    ],
)
def test_bad_command_line_is_one_line(argv, needle):
    result = hasten_launch(*argv)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = launcher_lines(result.stderr)
    assert len(lines) == 1 and needle in lines[0], result.stderr


def test_busy_port_on_one_machine_warns_and_moves_on_and_strict_refuses_it():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        # As Accelerate: its warning, then a free port for this run.
        result = hasten_launch("--num_processes", "2", "--main_process_port", port, FAILURES, "no-destroy")
        assert result.returncode == 0, result.stderr
        assert f"Port `{port}` is already in use" in result.stderr and "--main_process_port 0" in result.stderr
        assert result.stdout.count("NO-DESTROY RANK") == 2, result.stdout + result.stderr
        # strict: a port you named that is taken is an error, before anything starts.
        result = hasten_launch("--strict", "--num_processes", "2", "--main_process_port", port, FAILURES, "no-destroy")
    assert result.returncode != 0
    lines = launcher_lines(result.stderr)
    assert len(lines) == 1 and f"port {port} is already in use" in lines[0], result.stderr
    assert "NO-DESTROY" not in result.stdout  # nothing was started
    assert "Traceback" not in result.stderr


def test_port_is_29500_unless_given_and_busy_across_machines_is_a_connection_error(monkeypatch):
    import hasten.launch.plan as launch_module
    from hasten.commands.launch import PORT_IN_USE_WARNING, LaunchPlan, _resolve_port

    monkeypatch.setattr(launch_module, "_port_in_use", lambda host, port: False)
    assert _resolve_port(LaunchPlan(num_processes=2)) == 29500  # Accelerate's default, not a random port
    assert _resolve_port(LaunchPlan(num_processes=2, main_process_port=29777)) == 29777
    assert _resolve_port(LaunchPlan(num_processes=2, main_process_port=0)) not in (0, 29500)  # 0: any free port
    monkeypatch.setattr(launch_module, "_port_in_use", lambda host, port: True)
    with pytest.warns(UserWarning, match="Port `29500` is already in use") as caught:
        assert _resolve_port(LaunchPlan(num_processes=2)) != 29500
    assert str(caught[0].message) == PORT_IN_USE_WARNING.format(port=29500)
    with pytest.raises(ConnectionError, match="port 29500 is already in use"):
        _resolve_port(LaunchPlan(num_processes=4, num_machines=2, main_process_ip="10.0.0.1"))
    assert _resolve_port(LaunchPlan(num_processes=4, num_machines=2, machine_rank=1)) == 29500  # not its port


# -- one process runs in place ------------------------------------------------------------------------------

def test_single_process_exit_code_passes_through():
    result = hasten_launch("--num_processes", "1", FAILURES, "exit", "4")
    assert result.returncode == 4, result.stderr


# -- failing ranks ------------------------------------------------------------------------------------------

def test_crashing_rank_is_named_and_launcher_exits_non_zero():
    result = launch(FAILURES, "crash", check=False)
    assert result.returncode != 0
    lines = launcher_lines(result.stderr)
    assert len(lines) == 1, result.stderr
    # The rank that raised is named first, with its error, even when rank 0 exits before it.
    assert lines[0].startswith("hasten launch: rank 1 (local rank 1) failed: ValueError: rank 1 fails on purpose")
    assert "ValueError: rank 1 fails on purpose" in result.stderr  # the process's own traceback is kept
    # No torch elastic agent chatter or launcher traceback around it.
    assert "ChildFailedError" not in result.stderr and "elastic" not in result.stderr


def test_rank_killed_without_a_python_error_is_named():
    result = launch(FAILURES, "killed", check=False)
    assert result.returncode != 0
    lines = launcher_lines(result.stderr)
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("hasten launch: rank 1 (local rank 1) was killed by signal 9"), lines[0]


def test_debug_mode_mismatch_fails_with_a_clear_error():
    result = launch(FAILURES, "mismatch", flags=["--debug"], check=False)
    assert result.returncode != 0
    lines = launcher_lines(result.stderr)
    assert len(lines) == 1, result.stderr
    assert "DistributedOperationException: `gather` got tensors whose shapes" in lines[0]
    assert "rank 1 differs from rank 0" in lines[0] and "rank 0: [1, 4]" in lines[0] and "rank 1: [2, 4]" in lines[0]


# -- restarts and clean exits -------------------------------------------------------------------------------

def test_max_restarts_recovers_from_a_crash():
    """Attempt 0 crashes on rank 1; torchelastic restarts both ranks and attempt 1 must rendezvous cleanly."""
    result = launch(FAILURES, "restart", flags=["--max_restarts", "1"], check=False)
    assert result.returncode == 0, result.stderr
    assert "attempt 0 fails on purpose" in result.stderr
    for rank in range(2):
        assert f"ATTEMPT 1 RANK {rank} OK" in result.stdout
    assert "ATTEMPT 0" not in result.stdout


def test_exit_without_destroy_process_group_is_clean():
    """torch 2.13 + gloo aborts at exit about half the time when a group is left alive; hasten tears it down.

    Five whole launches (two as `-m module`), each must exit 0 on every rank.
    """
    env = {"PYTHONPATH": os.pathsep.join([str(SCRIPTS), os.environ.get("PYTHONPATH", "")])}
    outcomes = []
    for attempt in range(5):
        if attempt % 2:
            result = hasten_launch("--num_processes", "2", "-m", "core_failures", "no-destroy",
                                   env={**env, "PYTHONUNBUFFERED": "1"})
        else:
            result = launch(FAILURES, "no-destroy", check=False)
        outcomes.append((result.returncode, result.stderr[-500:]))
        assert result.stdout.count("NO-DESTROY RANK") == 2, result.stdout + result.stderr
    assert [code for code, _ in outcomes] == [0] * 5, outcomes


def test_gpu_count_errors_are_not_swallowed(monkeypatch, capsys):
    """A CUDA device node that torch cannot see launches on the CPU with a warning, as Accelerate launches it
    (strict: refused); a driver error is not swallowed."""
    import torch

    from hasten.config import launch_settings
    from hasten.core.errors import LaunchError

    def broken():
        raise RuntimeError("CUDA driver initialization failed")

    monkeypatch.setattr(torch.cuda, "device_count", broken)
    with pytest.raises(RuntimeError, match="driver initialization"):
        launch_settings._gpu_count()
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setattr(launch_settings.os.path, "exists", lambda path: path == "/dev/nvidia0")
    monkeypatch.setattr(launch_settings, "_WARNED", set())
    assert launch_settings._gpu_count() == 0 and launch_settings._gpu_count() == 0
    warned = capsys.readouterr().err.splitlines()
    assert len(warned) == 1 and "sees none; launching on the CPU" in warned[0], warned
    with pytest.raises(LaunchError, match="sees none.*--cpu"):
        launch_settings._gpu_count(strict=True)


def test_more_processes_than_visible_gpus_is_refused_at_launch(monkeypatch):
    """CUDA_VISIBLE_DEVICES=0 with two processes: each process alone sees one GPU, as under a per-process binding,
    so only the launcher can tell that both would sit on GPU 0. It refuses in one line; naming the device shares
    it on purpose; as many processes as GPUs, or a CPU run, goes ahead."""
    from hasten.commands.launch import launch_command_parser
    from hasten.config import launch_settings
    from hasten.core.errors import ConfigError

    monkeypatch.setattr(launch_settings, "_gpu_count", lambda strict=False: 1)

    def settle(*argv, env=None):
        return launch_settings.resolve_launch(launch_command_parser().parse_args([*argv, "x.py"]), env=env or {})

    with pytest.raises(ConfigError, match=r"2 processes per machine .* only GPUs 0 are visible "
                       r"\(from environment CUDA_VISIBLE_DEVICES\).*fix: --num_processes 1"):
        settle("--num_processes", "2", env={"CUDA_VISIBLE_DEVICES": "0"})
    with pytest.raises(ConfigError, match=r"4 processes per machine .* only GPUs 0,1 are visible \(from --gpu_ids\).*fix: "
                       r"--num_processes 4"):
        settle("--num_processes", "8", "--num_machines", "2", "--main_process_ip", "10.0.0.1", "--gpu_ids", "0,1")
    assert settle("--num_processes", "2", env={"HASTEN_TORCH_DEVICE": "cuda:0"}).values["num_processes"].value == 2
    assert settle("--num_processes", "1").values["num_processes"].value == 1
    with pytest.raises(ConfigError, match=r"3 processes per machine .* torch sees 1 GPU: .*--num_processes 1,"):
        settle("--num_processes", "3")
    assert settle("--cpu", "--num_processes", "2").values["num_processes"].value == 2


def test_module_target_is_found_from_the_working_directory_as_python_m_finds_it(tmp_path):
    # `hasten launch -m pkg.train` started from the `hasten` command (whose sys.path[0] is its bin folder) must
    # import `pkg` from the working directory, as `python -m pkg.train` and Accelerate's launcher do.
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "train.py").write_text("import sys\nprint('RAN', sys.argv[1:])\n")
    command = os.path.join(os.path.dirname(sys.executable), "hasten")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HASTEN_", "ACCELERATE_", "PYTHONPATH"))}
    env["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")  # keeps a worktree's hasten, if a test run set one
    result = subprocess.run([command, "launch", "--cpu", "-m", "pkg.train", "--x", "1"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "RAN ['--x', '1']" in result.stdout
