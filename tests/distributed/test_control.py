"""The control plane (hasten.distributed.control) and the fixes of issue 22 that CPU processes can show.

Item 1 (a CPU flag all-reduced on NCCL) cannot fail with gloo: tests/distributed/test_control_plane_guard.py reads
the source for it, and the launched checks here prove the control collectives run on the control group.
"""

from __future__ import annotations

import pytest
import torch

from hasten.core.errors import ConfigError
from hasten.distributed import control
from hasten.state import PartialState, device_index
from launching import launch


def test_one_process_control_helpers_need_no_group():
    assert control.control_group() is None or torch.distributed.is_initialized()
    assert control.any_rank(True) and not control.any_rank(False)
    assert control.all_gather_objects(3) == [3] and control.broadcast_object("x") == "x"
    control.barrier()


@pytest.mark.parametrize("backend, serves", [("gloo", True), ("cpu:gloo,cuda:nccl", True), ("nccl", False),
                                             ("xccl", False)])
def test_which_default_groups_serve_cpu_tensors(backend, serves):
    assert control._serves_cpu(backend) == serves


# -- item 2: the device each process uses, and the barrier that cannot name another one ------------------------
def test_device_is_the_local_rank_or_the_one_visible_device():
    assert device_index("cuda", 3, count=4) == 3
    assert device_index("cuda", 0, count=1) == 0
    # SLURM --gpus-per-task=1: local rank 5 sees one GPU, its own. (Accelerate's barrier named device 5 here.)
    assert device_index("cuda", 5, count=1, env={"CUDA_VISIBLE_DEVICES": "5"}) == 0


def test_more_processes_than_devices_is_refused_not_shared():
    with pytest.raises(ConfigError, match="local process 4 has no cuda device of its own: this machine shows 4"):
        device_index("cuda", 4, count=4)


def test_more_processes_than_the_one_visible_gpu_is_refused_too():
    """Issue 30, item 11: with one GPU and no per-process binding, local process 1 would share it."""
    with pytest.raises(ConfigError, match="local process 1 has no cuda device of its own: this machine shows 1 cuda "
                                          "device; start at most 1 process per machine"):
        device_index("cuda", 1, count=1, env={})
    assert device_index("cuda", 0, count=1, env={}) == 0


def test_one_visible_gpu_refusal_reaches_partial_state(monkeypatch):
    """The refusal is what PartialState's device choice runs (a CUDA count of 1, simulated), and naming the device
    with HASTEN_TORCH_DEVICE is the way to share it on purpose (the GPU suite's 2-processes-on-1-GPU case)."""
    state = PartialState.__new__(PartialState)
    state.local_process_index = 1
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with pytest.raises(ConfigError, match="local process 1 has no cuda device"):
        PartialState._pick_device(state, "cuda")
    monkeypatch.setenv("HASTEN_TORCH_DEVICE", "cuda:0")
    assert PartialState._pick_device(state, "cuda") == torch.device("cuda", 0)


def test_wait_for_everyone_on_nccl_uses_the_control_group_not_a_device_id(monkeypatch):
    """What an NCCL run with one visible GPU per task does: local rank 1 on cuda:0 (nothing here touches CUDA)."""
    import torch.distributed as dist

    from hasten.core.enums import DistributedType

    state = PartialState()
    calls, group = [], object()
    monkeypatch.setattr(state, "distributed_type", DistributedType.MULTI_GPU)
    monkeypatch.setattr(state, "num_processes", 2)
    monkeypatch.setattr(state, "backend", "nccl")
    monkeypatch.setattr(state, "local_process_index", 1)
    monkeypatch.setattr(state, "device", torch.device("cuda", 0))
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(dist, "barrier", lambda *args, **kwargs: calls.append((args, kwargs)))
    monkeypatch.setattr(control, "control_group", lambda: group)
    state.wait_for_everyone()
    assert calls == [((), {"group": group})]  # no device_ids=[1] while the device is cuda:0


def test_launched_control_plane_and_fsdp_checkpoint_fixes(tmp_path):
    """Items 1 (control group), 5 (rank-0 load) and 6 (save_on_each_node) in 2 gloo processes."""
    result = launch("control_plane.py", tmp_path, flags=["--cpu"], timeout=300)
    assert result.stdout.count("control plane checks passed") == 2, result.stdout + result.stderr
