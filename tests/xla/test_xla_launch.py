"""`hasten launch --tpu` on torch_xla's CPU device: the script's --main_training_function in every replica
(`xmp.spawn`), one replica and two (with the test-only shim)."""

import re
import subprocess
import sys

import pytest

pytest.importorskip("torch_xla", reason="no torch_xla here: scripts/test.sh runs tests/xla in the side environment "
                                        "scripts/xla_env.sh builds")

from xla_runs import CASE_TIMEOUT, HERE, run, xla_env  # noqa: E402

SCRIPT = HERE / "workers" / "launched.py"


@pytest.mark.parametrize("replicas", [1, 2])
def test_hasten_launch_tpu_calls_the_main_function_in_every_replica(replicas):
    output = run([sys.executable, "-m", "hasten.commands.launch", "--tpu", "--num_processes", str(replicas),
                  "--main_training_function", "main", SCRIPT, "--flag", "value"], replicas=replicas,
                 timeout=max(CASE_TIMEOUT, 120 if replicas == 1 else CASE_TIMEOUT))
    # replicas are threads of one process: their prints may share a line, so the reports are found by pattern
    lines = sorted(re.findall(r"LAUNCHED \d+ \d+ \d+", output))
    assert lines == [f"LAUNCHED {i} {replicas} 10" for i in range(replicas)], output[-3000:]


def test_a_missing_main_function_is_one_line():
    with pytest.raises(AssertionError, match="should have a function named train"):
        run([sys.executable, "-m", "hasten.commands.launch", "--tpu", "--main_training_function", "train", SCRIPT])


@pytest.mark.parametrize("replicas", [1, 2])
def test_notebook_launcher_spawns_replicas_on_the_xla_device(replicas):
    output = run([HERE / "workers" / "notebook.py", replicas], replicas=replicas)
    lines = sorted(line for line in output.splitlines() if line.startswith("CELL"))
    assert lines == [f"CELL {i} {replicas} hi" for i in range(replicas)], output[-3000:]


def failing_notebook(mode: str) -> str:
    """The output of two notebook replicas of which replica 1 fails (`mode`: fail or crash); the run must fail."""
    done = subprocess.run([sys.executable, str(HERE / "workers" / "notebook.py"), "2", mode], env=xla_env(2),
                          capture_output=True, text=True, timeout=CASE_TIMEOUT, check=False)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output[-3000:]
    return output


def test_a_failing_replica_prints_its_own_error_and_releases_the_other():
    # Replica 1 raises; replica 0 waits in a collective for it. Before, XLA ended the process after ~15 s and
    # pjrt.spawn said only that a process "was terminated abruptly": replica 1's error was never printed.
    output = failing_notebook("fail")
    assert "XLA replica 1 failed" in output and "ValueError: replica 1 gave up" in output, output[-3000:]
    assert "XLA replica 0: another replica failed" in output, output[-3000:]  # released, not ended by XLA


def test_a_replica_that_crashes_prints_its_python_stacks():
    # A replica process killed by a signal: before, the output was only pjrt.spawn's "terminated abruptly".
    output = failing_notebook("crash")
    assert "Segmentation fault" in output and "in training_function" in output, output[-3000:]
