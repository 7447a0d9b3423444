"""Run a worker script of tests/xla/workers in a fresh process on torch_xla's CPU device (each XLA runtime is
one process's; hasten's state is too), with a timeout, and hand back its output."""

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
# Per case: a bound for a hang, not a speed target. Alone on 2 cores the two-replica cases take 5-12 s (the `late`
# case ~31 s, 20 s of which it sleeps on purpose); a busy machine may need more: HASTEN_XLA_CASE_TIMEOUT.
CASE_TIMEOUT = float(os.environ.get("HASTEN_XLA_CASE_TIMEOUT", "60"))


def xla_env(replicas: int = 1, **extra) -> dict:
    env = dict(os.environ)
    env.update(PJRT_DEVICE="CPU", CPU_NUM_DEVICES=str(replicas), HASTEN_XLA_TEST_SHIM="1")
    # the shim (sitecustomize) and this checkout's hasten come first on the path
    env["PYTHONPATH"] = os.pathsep.join([str(HERE / "shim"), str(ROOT / "src"), env.get("PYTHONPATH", "")])
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "USE_TORCH_XLA"):
        env.pop(name, None)
    env.update(extra)
    return env


def run(args, replicas: int = 1, timeout: float = CASE_TIMEOUT, cwd=None, **extra) -> str:
    """Run `python *args` (or a command list starting with an executable); fail the test on a non-zero exit or
    on the timeout, with the output."""
    command = list(args) if str(args[0]).endswith(("hasten", "python")) else [sys.executable, *map(str, args)]
    try:
        done = subprocess.run(command, check=False, env=xla_env(replicas, **extra), cwd=cwd, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as expired:
        out = (expired.stdout or b"").decode() if isinstance(expired.stdout, bytes) else (expired.stdout or "")
        raise AssertionError(f"{command} did not finish in {timeout:.0f} s:\n{out[-3000:]}") from None
    output = done.stdout + done.stderr
    # a replica that dies of a signal says which one first (faulthandler's "Fatal Python error" line), and that
    # line is far above the tail once every thread's stack follows it: keep it in the message
    fatal = "\n".join(line for line in output.splitlines() if "Fatal Python error" in line or "Current thread" in line)
    assert done.returncode == 0, f"{command} exited {done.returncode}:\n{fatal}\n...\n{output[-5000:]}"
    return output
