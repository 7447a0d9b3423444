"""Cluster and device detection as pure functions over plain dicts; `hasten env`; the cost of `import hasten`."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hasten.core.enums import DistributedType
from hasten.core.env import (
    first_slurm_host, env_flag, env_value, get_int_from_env, parse_flag_from_env, str_to_bool,
)
from hasten.distributed.cluster import ClusterInfo, choose_backend, detect_cluster, detect_device_type, distributed_type_for
from hasten.core.errors import ConfigError

# -- truthiness -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["1", "true", "TRUE", "yes", "Y", "t", "on", " On "])
def test_str_to_bool_true(text):
    assert str_to_bool(text) == 1 and str_to_bool(text, to_bool=True) is True


@pytest.mark.parametrize("text", ["0", "false", "No", "n", "f", "off"])
def test_str_to_bool_false(text):
    assert str_to_bool(text) == 0 and str_to_bool(text, to_bool=False) == 0 and str_to_bool(text, True) is False


@pytest.mark.parametrize("text", ["", "2", "maybe", "truee"])
def test_str_to_bool_rejects_other_text(text):
    with pytest.raises(ValueError, match="invalid truth value"):
        str_to_bool(text)


def test_hasten_variables_win_over_accelerate_ones():
    env = {"HASTEN_USE_CPU": "0", "ACCELERATE_USE_CPU": "1", "ACCELERATE_MIXED_PRECISION": "bf16"}
    assert env_flag("USE_CPU", env=env) is False
    assert env_value("MIXED_PRECISION", env=env) == "bf16"
    assert env_value("DEBUG_MODE", "fallback", env=env) == "fallback"
    assert env_flag("DEBUG_MODE", default=True, env=env) is True


def test_bad_boolean_variable_names_itself():
    with pytest.raises(ConfigError, match=r"ACCELERATE_DEBUG_MODE='sometimes' is not a boolean"):
        env_flag("DEBUG_MODE", env={"ACCELERATE_DEBUG_MODE": "sometimes"})


def test_accelerate_style_helpers(monkeypatch):
    monkeypatch.setenv("SOME_FLAG", "yes")
    assert parse_flag_from_env("SOME_FLAG") is True
    assert parse_flag_from_env("MISSING_FLAG", default=True) is True
    monkeypatch.setenv("A_INT", "-1")
    monkeypatch.setenv("B_INT", "3")
    assert get_int_from_env(["A_INT", "B_INT"], 7) == 3
    assert get_int_from_env(["MISSING_INT"], 7) == 7
    monkeypatch.setenv("A_INT", "three")
    with pytest.raises(ConfigError, match="A_INT='three' must be an integer"):
        get_int_from_env(["A_INT"], 0)


# -- cluster detection ------------------------------------------------------------------------------------------


def test_nothing_set_is_a_single_process():
    info = detect_cluster({})
    assert info == ClusterInfo(launcher="single")
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size, info.num_nodes) == (0, 1, 0, 1, 1)


def test_torchrun_variables():
    env = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1",
           "MASTER_ADDR": "node0", "MASTER_PORT": "29400"}
    info = detect_cluster(env)
    assert info.launcher == "torchrun"
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size, info.node_rank) == (5, 8, 1, 4, 1)
    assert (info.master_addr, info.master_port, info.num_nodes) == ("node0", 29400, 2)


def test_torchrun_wins_inside_a_slurm_allocation():
    env = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "h", "MASTER_PORT": "1",
           "SLURM_PROCID": "0", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "1"}
    assert detect_cluster(env).launcher == "torchrun"


SRUN = {"SLURM_PROCID": "5", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
        "SLURM_STEP_TASKS_PER_NODE": "4(x2)", "SLURM_STEP_NODELIST": "gpu[03-05,09]"}


def test_slurm_under_srun():
    info = detect_cluster(SRUN)
    assert info.launcher == "slurm"
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size, info.node_rank) == (5, 8, 1, 4, 1)
    assert (info.master_addr, info.master_port) == ("gpu03", 29500)


def test_slurm_explicit_tasks_per_node_and_master_address():
    env = {**SRUN, "SLURM_NTASKS_PER_NODE": "2", "SLURM_NTASKS": "4", "SLURM_PROCID": "3",
           "MASTER_ADDR": "10.1.1.1", "MASTER_PORT": "1234"}
    info = detect_cluster(env)
    assert (info.local_world_size, info.master_addr, info.master_port, info.num_nodes) == (2, "10.1.1.1", 1234, 2)


def test_slurm_batch_shell_without_srun_is_single():
    # Inside `sbatch` but outside `srun` only the batch script runs: one process.
    assert detect_cluster({"SLURM_PROCID": "0", "SLURM_NTASKS": "8", "SLURM_JOB_ID": "1"}).launcher == "single"


@pytest.mark.parametrize(
    ("nodelist", "first"),
    [("node1", "node1"), ("node[1-3]", "node1"), ("gpu[03-05,09],cpu1", "gpu03"), ("a,b", "a"),
     ("rack1-n[7,9]", "rack1-n7")],
)
def test_first_slurm_host(nodelist, first):
    assert first_slurm_host(nodelist) == first


def test_open_mpi():
    env = {"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
           "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_COMM_WORLD_NODE_RANK": "1", "MASTER_ADDR": "head"}
    info = detect_cluster(env)
    assert info.launcher == "mpi"
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size) == (3, 4, 1, 2)
    assert (info.node_rank, info.master_addr, info.master_port) == (1, "head", 29500)


def test_mpich_and_intel_mpi():
    env = {"PMI_SIZE": "2", "PMI_RANK": "1", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}
    info = detect_cluster(env)
    assert (info.launcher, info.rank, info.world_size, info.local_rank, info.node_rank) == ("mpi", 1, 2, 1, 0)
    # One machine: the rendezvous is local without MASTER_ADDR.
    assert (info.master_addr, info.master_port) == ("127.0.0.1", 29500)


def test_mvapich():
    env = {"MV2_COMM_WORLD_SIZE": "6", "MV2_COMM_WORLD_RANK": "4", "MV2_COMM_WORLD_LOCAL_RANK": "0",
           "MV2_COMM_WORLD_LOCAL_SIZE": "2", "MASTER_ADDR": "m"}
    info = detect_cluster(env)
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size, info.node_rank) == (4, 6, 0, 2, 2)


def test_mpi_over_several_machines_needs_master_addr():
    env = {"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
           "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    with pytest.raises(ConfigError, match="set MASTER_ADDR"):
        detect_cluster(env)


def test_plain_rank_and_world_size():
    info = detect_cluster({"RANK": "1", "WORLD_SIZE": "2"})
    assert (info.launcher, info.rank, info.world_size, info.local_rank) == ("env", 1, 2, 1)
    assert (info.master_addr, info.master_port) == ("127.0.0.1", 29500)


def test_world_size_one_without_launcher_is_single():
    assert detect_cluster({"WORLD_SIZE": "1"}).launcher == "single"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RANK": "x", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, "RANK='x' must be an integer"),
        ({"RANK": "0", "WORLD_SIZE": "0", "LOCAL_RANK": "0"}, "WORLD_SIZE=0 must be >= 1"),
        ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "-1"}, "LOCAL_RANK=-1 must be >= 0"),
        ({"RANK": "2", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, "rank 2 is not below the world size 2"),
        ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"}, "local rank 2 is not below"),
        ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "4"}, "larger than the world size"),
        ({"MASTER_PORT": "http"}, "MASTER_PORT='http' must be an integer"),
        ({"MASTER_PORT": "70000"}, "not a TCP port"),
        ({**SRUN, "SLURM_NTASKS": "two"}, "SLURM_NTASKS='two'"),
        ({"PMI_SIZE": "2", "PMI_RANK": "-3"}, "PMI_RANK=-3"),
        ({"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "5"}, "rank 5 is not below the world size 2"),
    ],
)
def test_bad_cluster_variables_are_config_errors(env, message):
    with pytest.raises(ConfigError, match=message) as caught:
        detect_cluster(env)
    assert "\n" not in str(caught.value)
    assert isinstance(caught.value, ValueError)  # callers that catch Accelerate's ValueError still work


# -- device discovery -------------------------------------------------------------------------------------------


def _only(*present):
    return lambda device_type: device_type in present


@pytest.mark.parametrize(
    ("present", "expected"),
    [((), "cpu"), (("npu",), "npu"), (("mps", "npu"), "mps"), (("xpu", "mps"), "mps"), (("cuda", "xpu"), "cuda"),
     (("cuda", "xpu", "npu"), "npu"), (("cuda", "neuron"), "cuda"), (("mlu", "sdaa", "musa"), "mlu")],
)
def test_device_order_is_accelerates(present, expected):
    assert detect_device_type(env={}, available=_only(*present)) == expected


@pytest.mark.parametrize("env", [{"HASTEN_USE_CPU": "1"}, {"ACCELERATE_USE_CPU": "yes"}, {"HASTEN_USE_CPU": "true"}])
def test_use_cpu_variables_force_cpu(env):
    assert detect_device_type(env=env, available=_only("cuda")) == "cpu"


def test_cpu_argument_and_variable_precedence():
    assert detect_device_type(cpu=True, env={}, available=_only("cuda")) == "cpu"
    # HASTEN_USE_CPU=0 wins over ACCELERATE_USE_CPU=1.
    assert detect_device_type(env={"HASTEN_USE_CPU": "0", "ACCELERATE_USE_CPU": "1"}, available=_only("cuda")) == "cuda"
    assert detect_device_type(env={"ACCELERATE_TORCH_DEVICE": "xpu:1"}, available=_only("cuda")) == "xpu"
    with pytest.raises(ConfigError, match="HASTEN_USE_CPU='please'"):
        detect_device_type(env={"HASTEN_USE_CPU": "please"}, available=_only())


def test_backend_and_distributed_type():
    assert choose_backend("cuda") == "nccl" and choose_backend("cpu") == "gloo"
    assert choose_backend("cpu", requested="mpi") == "mpi"
    assert distributed_type_for("cpu", 1, launched=False) == DistributedType.NO
    assert distributed_type_for("cuda", 1, launched=False) == DistributedType.NO
    # N processes on a CPU-only machine are MULTI_CPU without any flag (unlike Accelerate).
    assert distributed_type_for("cpu", 2, launched=True) == DistributedType.MULTI_CPU
    assert distributed_type_for("cpu", 1, launched=True) == DistributedType.MULTI_CPU
    assert distributed_type_for("cuda", 4, launched=True) == DistributedType.MULTI_GPU
    assert distributed_type_for("xpu", 4, launched=True) == DistributedType.MULTI_XPU


def test_real_machine_detects_cpu():
    assert detect_device_type(env={}) in ("cpu", "cuda", "xpu", "mps", "npu")


# -- `hasten env` -----------------------------------------------------------------------------------------------


def test_hasten_env_prints_versions_and_settings(monkeypatch, capsys):
    import torch

    from hasten.commands import env as env_command

    monkeypatch.setenv("HASTEN_DEBUG_MODE", "1")
    assert env_command.main([]) == 0
    out = capsys.readouterr().out
    assert f"PyTorch version: {torch.__version__}" in out
    assert "`hasten` version: " in out and "Python version: " in out
    assert "env HASTEN_DEBUG_MODE: 1" in out


# -- import cost ------------------------------------------------------------------------------------------------

def _run(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          timeout=180).stdout


def test_import_hasten_loads_nothing_optional():
    assert _run("import sys, hasten; print('torch' in sys.modules)").strip() == "False", \
        "`import hasten` alone must not even load torch"
    # What hasten's core adds on top of what torch itself loads: only hasten and the standard library.
    extra = _run(
        "import sys, torch; before = set(sys.modules); "
        "import hasten, hasten.utils; from hasten import PartialState, get_logger, set_seed, notebook_launcher; "
        "hasten.utils.gather; hasten.utils.send_to_device; hasten.utils.reduce; from hasten import Accelerator; "
        "print(' '.join(sorted({name.split('.')[0] for name in set(sys.modules) - before})))"
    ).split()
    allowed = {"hasten"} | set(sys.stdlib_module_names)
    assert set(extra) <= allowed, f"importing hasten's core loaded optional libraries: {sorted(set(extra) - allowed)}"
    for optional in ("yaml", "safetensors", "psutil", "packaging", "tensorboard", "wandb", "deepspeed"):
        assert optional not in extra


# -- the same detection, end to end, without torchrun -----------------------------------------------------------

def _start_ranks(variables_for_rank, script_args=(), timeout=180):
    """Start one plain `python script` per rank with launcher variables (as srun/mpirun would) and wait."""
    import os

    from launching import SCRIPTS

    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("HASTEN_", "ACCELERATE_", "TORCHELASTIC_")) and k not in ("RANK", "WORLD_SIZE")}
    base["PYTHONUNBUFFERED"] = "1"
    procs = [subprocess.Popen([sys.executable, str(SCRIPTS / "core_collectives.py"), *script_args],
                              env={**base, **variables_for_rank(rank)}, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for rank in range(2)]
    try:
        outputs = [proc.communicate(timeout=timeout)[0] for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
    return [proc.returncode for proc in procs], outputs


def test_slurm_and_open_mpi_ranks_run_collectives_without_torchrun():
    """srun- and mpirun-style variables alone (no torchrun agent): rank 0 hosts the store, collectives work."""
    from hasten.commands.launch import get_free_port

    port = str(get_free_port())
    srun = lambda rank: {"SLURM_PROCID": str(rank), "SLURM_STEP_ID": "0", "SLURM_NTASKS": "2",  # noqa: E731
                         "SLURM_LOCALID": str(rank), "SLURM_NODEID": "0", "SLURM_STEP_TASKS_PER_NODE": "2",
                         "SLURM_STEP_NODELIST": "localhost", "MASTER_PORT": port}
    codes, outputs = _start_ranks(srun)
    assert codes == [0, 0], outputs
    assert all(f"CHECKS-PASSED {rank}" in outputs[rank] for rank in range(2)), outputs

    port = str(get_free_port())
    mpirun = lambda rank: {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": str(rank),  # noqa: E731
                           "OMPI_COMM_WORLD_LOCAL_RANK": str(rank), "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
                           "MASTER_PORT": port, "HASTEN_DEBUG_MODE": "1"}
    codes, outputs = _start_ranks(mpirun)
    assert codes == [0, 0], outputs
    assert all(f"CHECKS-PASSED {rank}" in outputs[rank] for rank in range(2)), outputs


# -- NUMA affinity (--enable_cpu_affinity) ---------------------------------------------------------------------------


def _fake_sysfs(root, nodes, gpu_node=None):
    for index, cpus in enumerate(nodes):
        folder = root / "devices" / "system" / "node" / f"node{index}"
        folder.mkdir(parents=True)
        (folder / "cpulist").write_text(cpus + "\n")
    if gpu_node is not None:
        device = root / "bus" / "pci" / "devices" / "0000:3b:00.0"
        device.mkdir(parents=True)
        (device / "numa_node").write_text(f"{gpu_node}\n")
    return str(root)


def test_numa_cpus_follow_the_gpu_or_spread_cpu_processes(tmp_path):
    from hasten.distributed.numa import numa_cpus, parse_cpu_list

    assert parse_cpu_list("0-2,8,10-11") == [0, 1, 2, 8, 10, 11]
    root = _fake_sysfs(tmp_path / "a", ["0-1", "2-3"], gpu_node=1)
    assert numa_cpus("cuda", "0000:3B:00.0", 0, root) == [2, 3]  # the GPU's node, whatever the local rank
    assert numa_cpus("cpu", None, 1, root) == [2, 3] and numa_cpus("cpu", None, 2, root) == [0, 1]
    unknown = _fake_sysfs(tmp_path / "b", ["0-3"], gpu_node=-1)
    assert numa_cpus("cuda", "0000:3b:00.0", 0, unknown) is None  # the kernel does not know: leave it alone
    assert numa_cpus("cpu", None, 0, str(tmp_path / "nothing")) is None


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this platform")
def test_pin_to_numa_node_restricts_this_process(tmp_path):
    from hasten.distributed.numa import pin_to_numa_node

    before = os.sched_getaffinity(0)
    first = min(before)
    root = _fake_sysfs(tmp_path, [str(first), "100000"])
    try:
        assert pin_to_numa_node("cpu", None, 0, root) == [first]
        assert os.sched_getaffinity(0) == {first}
        assert pin_to_numa_node("cpu", None, 1, root) is None  # no CPU of that node is allowed: unchanged
    finally:
        os.sched_setaffinity(0, before)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this platform")
def test_enable_cpu_affinity_pins_the_process_when_the_state_is_made(tmp_path, monkeypatch):
    from hasten import PartialState
    from hasten.distributed import numa

    before = os.sched_getaffinity(0)
    first = min(before)
    monkeypatch.setattr(numa, "SYSFS", _fake_sysfs(tmp_path, [str(first), "100000"]))
    monkeypatch.setenv("ACCELERATE_CPU_AFFINITY", "1")  # what `accelerate launch --enable_cpu_affinity` exports
    try:
        PartialState()
        assert os.sched_getaffinity(0) == {first}  # local process 0 of a CPU run: node 0
    finally:
        os.sched_setaffinity(0, before)


# -- issue 30, item 8: FSDP CPU offload needs a default group that serves CPU tensors too -----------------------
@pytest.mark.parametrize("env, expected", [
    ({"ACCELERATE_USE_FSDP": "true", "FSDP_OFFLOAD_PARAMS": "true"}, "cuda:nccl,cpu:gloo"),
    ({"HASTEN_USE_FSDP": "1", "FSDP_OFFLOAD_PARAMS": "True"}, "cuda:nccl,cpu:gloo"),
    ({"ACCELERATE_USE_FSDP": "true", "FSDP_OFFLOAD_PARAMS": "false"}, "nccl"),
    ({"FSDP_OFFLOAD_PARAMS": "true"}, "nccl"),
    ({"ACCELERATE_USE_FSDP": "true", "FSDP_STATE_DICT_TYPE": "FULL_STATE_DICT"}, "cuda:nccl,cpu:gloo"),
    ({"ACCELERATE_USE_FSDP": "true", "FSDP_STATE_DICT_TYPE": "SHARDED_STATE_DICT"}, "nccl"),
    ({}, "nccl"),
])
def test_fsdp_cpu_offload_makes_the_default_group_serve_both_devices(env, expected):
    assert choose_backend("cuda", env=env) == expected
    assert choose_backend("cpu", env=env) == "gloo"  # gloo serves CPU tensors already
    assert choose_backend("xpu", env=env) == expected.replace("cuda:nccl", "xpu:xccl").replace("nccl", "xccl")
    assert choose_backend("cuda", requested="nccl", env=env) == "nccl"  # what the script asked for wins


# -- issue 41, item 6: the same rule when the FSDP plugin is built in code (the launcher exported nothing) ---------
class _GroupStop(Exception):
    pass


def _backend_of_the_group(monkeypatch, **accelerator_kwargs) -> str:
    """The backend string `Accelerator(...)` would make the default group with, as torchrun's rank 0 of 2 on a CUDA
    machine: device detection says CUDA, and joining the group records the string and stops there."""
    import torch

    import hasten.state as state_module
    from hasten import Accelerator

    for name, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(state_module.environment, "detect_device_type", lambda cpu=False, env=None: "cuda")
    monkeypatch.setattr(state_module.PartialState, "_pick_device", lambda self, device_type: torch.device("cuda", 0))
    monkeypatch.setattr(state_module.PartialState, "set_device", lambda self: None)
    seen = []

    def join(cluster, backend, kwargs):
        seen.append(backend)
        raise _GroupStop

    monkeypatch.setattr(state_module, "init_process_group", join)
    with pytest.raises(_GroupStop):
        Accelerator(**accelerator_kwargs)
    return seen[0]


@pytest.mark.parametrize("plugin_kwargs, expected", [
    ({"fsdp_version": 2, "cpu_offload": True}, "cuda:nccl,cpu:gloo"),
    ({"fsdp_version": 1, "cpu_offload": True}, "cuda:nccl,cpu:gloo"),
    ({"fsdp_version": 2, "state_dict_type": "FULL_STATE_DICT"}, "cuda:nccl,cpu:gloo"),
    ({"fsdp_version": 2}, "nccl"),
])
def test_an_fsdp_plugin_built_in_code_decides_the_default_group(monkeypatch, plugin_kwargs, expected):
    """`norm.full_tensor()` of CPU-offloaded gradients is a collective on the default group: plain NCCL cannot
    serve it. Only the launcher's variables used to say "offload"; a plugin built in code must say it too."""
    from hasten.config.fsdp import FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin(**plugin_kwargs)
    assert _backend_of_the_group(monkeypatch, fsdp_plugin=plugin) == expected


def test_without_fsdp_the_default_group_is_plain_nccl(monkeypatch):
    assert _backend_of_the_group(monkeypatch) == "nccl"


def test_fsdp_offload_variable_that_is_not_a_boolean_is_refused():
    with pytest.raises(ConfigError, match="FSDP_OFFLOAD_PARAMS='maybe' is not a boolean"):
        choose_backend("cuda", env={"ACCELERATE_USE_FSDP": "true", "FSDP_OFFLOAD_PARAMS": "maybe"})


def test_a_cpu_norm_goes_where_the_group_can_reduce_it(monkeypatch):
    import torch

    from hasten.distributed.grad_norm import reduction_device

    cpu = torch.device("cpu")
    assert reduction_device(cpu, "gloo") == cpu
    assert reduction_device(cpu, "cuda:nccl,cpu:gloo") == cpu
    # NCCL alone serves no CPU tensor: the norm of CPU-offloaded gradients moves to the current accelerator (a GPU
    # process is simulated: the accelerator is "cuda", device 1).
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda *a, **k: torch.device("cuda"))
    monkeypatch.setattr(torch.accelerator, "current_device_index", lambda: 1)
    assert reduction_device(cpu, "nccl") == torch.device("cuda", 1)
    assert reduction_device(torch.device("cuda", 1), "nccl") == torch.device("cuda", 1)
