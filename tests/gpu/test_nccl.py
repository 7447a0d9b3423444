"""NCCL process groups and the control plane beside them (issue 22, items 1 and 2)."""

from __future__ import annotations

from conftest import two_gpus
from launching import launch


def test_nccl_world_1_control_plane_and_fsdp_prepare(tmp_path):
    result = launch("gpu_nccl.py", tmp_path, num_processes=1, timeout=300)
    assert "nccl checks passed" in result.stdout, result.stdout + result.stderr


@two_gpus
def test_nccl_world_2_control_plane_and_fsdp_prepare(tmp_path):
    result = launch("gpu_nccl.py", tmp_path, num_processes=2, timeout=300)
    assert result.stdout.count("nccl checks passed") == 2, result.stdout + result.stderr
