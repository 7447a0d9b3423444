"""Run scripts through `hasten launch` in real processes, for the distributed tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
SCRIPTS = TESTS / "workers"  # the scripts the distributed tests launch
FIXTURES = TESTS / "fixtures"


def launch(script, *script_args, num_processes: int = 2, flags=(), env=None, timeout: float = 180, check=True):
    """`hasten launch --num_processes N [flags] script args`; returns the CompletedProcess (text)."""
    script = Path(script)
    if not script.is_absolute():
        script = SCRIPTS / script
    # A free port per launch: launches on one machine default to 29500 (as Accelerate), and test runs side by side
    # would otherwise meet there (a busy 29500 only warns and moves on, but the check and the bind can race).
    port = [] if any(str(f).startswith("--main_process_port") for f in flags) else ["--main_process_port", "0"]
    command = [sys.executable, "-m", "hasten", "launch", "--num_processes", str(num_processes), *port, *flags,
               str(script), *map(str, script_args)]
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("HASTEN_", "ACCELERATE_"))}
    full_env.update(env or {})
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=full_env)
    if check and result.returncode != 0:
        raise AssertionError(
            f"{' '.join(command)} exited {result.returncode}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
        )
    return result
