"""`bash scripts/gpu_check.sh --dry-run` (issue 30, item 5): every case of the GPU suite is planned with a time
estimate and the plan fits the script's inner timeout (420 s, inside the device's 10-minute command limit)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from gpu_suite import CUDA
from launching import REPO


@pytest.mark.skipif(CUDA, reason="plans the GPU run: CI only")
def test_dry_run_lists_every_case_with_an_estimate_that_fits():
    env = {**os.environ, "PYTHON": sys.executable}
    result = subprocess.run(["bash", "scripts/gpu_check.sh", "--dry-run"], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    total = re.search(r"(\d+) cases; estimated total (\d+) s of the 420 s inner timeout", result.stdout)
    assert total and int(total.group(2)) <= 420, result.stdout
    planned = [line for line in result.stdout.splitlines() if line.startswith("tests/gpu/")]
    assert len(planned) == int(total.group(1)) >= 20, result.stdout
    assert "test_two_processes_on_one_gpu_run_the_control_plane" in result.stdout


def test_the_script_is_time_boxed_for_the_device():
    script = (REPO / "scripts" / "gpu_check.sh").read_text()
    assert 'PYTHON="${PYTHON:-python3}"' in script  # the GPU image has python3 only
    assert re.search(r'GPU_CHECK_TIMEOUT:-(\d+)', script).group(1) == "420"
    assert "--no-index" in script and ".whl/" in script  # the carried wheels, installed with no index
