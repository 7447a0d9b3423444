"""The hang doctor on NCCL (issue 22, item 7): a collective that NCCL queued and never completed is reported,
though the rank blocks later, outside the collective call. Two GPUs; the gloo twin runs in CI."""

from __future__ import annotations

from gpu_suite import launch_world, two_gpus
from launching import SCRIPTS


def _line(marker: str) -> int:
    for number, line in enumerate((SCRIPTS / "gpu_hang.py").read_text().splitlines(), start=1):
        if f"SITE:{marker}" in line:
            return number
    raise AssertionError(marker)


@two_gpus
def test_queued_collective_is_reported_before_the_backends_own_timeout():
    result = launch_world("gpu_hang.py", num_processes=2, flags=["--debug"], env={"HASTEN_COLLECTIVE_TIMEOUT": "20"},
                          timeout=180, check=False)
    assert result.returncode != 0
    report = result.stderr
    assert f"gpu_hang.py:{_line('nccl-all-reduce')} timed out on rank 0" in report, report
    assert "its call returned, but the backend never completed it" in report, report
    assert f"rank 1 never arrived (it is running Python code at tests/workers/gpu_hang.py:{_line('nccl-sleep')}" \
        in report, report
