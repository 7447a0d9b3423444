"""The default group on the device at hand (NCCL on a GPU, gloo in CI) and the control plane beside it
(issue 22, items 1 and 2; issue 30, items 1 and 2)."""

from __future__ import annotations

from gpu_suite import CUDA, device_only_skips, launch_world, two_gpus


def test_world_1_is_a_real_group_with_control_plane_and_fsdp_prepare(tmp_path):
    result = launch_world("gpu_nccl.py", tmp_path, num_processes=1)
    assert "nccl checks passed" in result.stdout, result.stdout + result.stderr
    assert device_only_skips(result) == (0 if CUDA else 3), result.stdout


@two_gpus
def test_world_2_control_plane_and_fsdp_prepare(tmp_path):
    result = launch_world("gpu_nccl.py", tmp_path, num_processes=2)
    assert result.stdout.count("nccl checks passed") == 2, result.stdout + result.stderr


def test_two_processes_on_one_gpu_run_the_control_plane(tmp_path):
    """NCCL refuses two ranks on one GPU at its first data collective, so on one GPU the only way to see the
    control plane beside a real two-rank NCCL group: every control collective (any_rank, object gathers,
    wait_for_everyone) and FSDP2's prepare(), stopping before any NCCL data collective. A CPU tensor sent to
    NCCL would fail here. Sharing the GPU is asked for by naming it (HASTEN_TORCH_DEVICE), as item 11's
    refusal says."""
    env = {"HASTEN_TORCH_DEVICE": "cuda:0"} if CUDA else {}
    result = launch_world("gpu_nccl.py", tmp_path, "--control-only", num_processes=2, env=env)
    assert result.stdout.count("control plane checks passed") == 2, result.stdout + result.stderr
