"""Environment helpers (Accelerate's `utils.environment` extras) and launch helpers (`utils.launch`)."""

from __future__ import annotations

import os
import shutil
import sys
import unittest

import pytest

import hasten.utils as utils
from hasten.commands.launch import launch_command_parser
from hasten.core.errors import ConfigError
from hasten.utils.environment import CPUInformation, override_numa_affinity
from hasten.utils.launch import env_var_path_add


def test_patch_environment_sets_upper_cased_strings_and_restores(monkeypatch):
    monkeypatch.setenv("KEEP_ME", "old")
    monkeypatch.delenv("NEW_ONE", raising=False)
    with utils.patch_environment(keep_me=1, new_one=2.5):
        assert os.environ["KEEP_ME"] == "1" and os.environ["NEW_ONE"] == "2.5"
    assert os.environ["KEEP_ME"] == "old"
    assert "NEW_ONE" not in os.environ


def test_patch_environment_restores_after_an_exception(monkeypatch):
    monkeypatch.delenv("BOOM_VAR", raising=False)
    with pytest.raises(RuntimeError):
        with utils.patch_environment(BOOM_VAR="x"):
            raise RuntimeError
    assert "BOOM_VAR" not in os.environ


def test_clear_environment_empties_then_restores(monkeypatch):
    monkeypatch.setenv("SOMETHING", "here")
    with utils.clear_environment():
        assert dict(os.environ) == {}
        os.environ["ADDED_INSIDE"] = "1"
    assert os.environ["SOMETHING"] == "here"
    assert "ADDED_INSIDE" not in os.environ


def test_purge_on_a_function_restores_changed_added_and_deleted(monkeypatch):
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "no")
    monkeypatch.setenv("HASTEN_USE_CPU", "true")

    @utils.purge_accelerate_environment
    def meddle():
        os.environ["ACCELERATE_MIXED_PRECISION"] = "fp16"
        os.environ["ACCELERATE_NEW"] = "1"
        del os.environ["HASTEN_USE_CPU"]  # Accelerate 1.15 does not bring a deleted variable back
        os.environ["OTHER_VAR_KEPT"] = "1"
        return "done"

    monkeypatch.delenv("OTHER_VAR_KEPT", raising=False)
    assert meddle() == "done"
    assert os.environ["ACCELERATE_MIXED_PRECISION"] == "no"
    assert "ACCELERATE_NEW" not in os.environ
    assert os.environ["HASTEN_USE_CPU"] == "true"
    assert os.environ.pop("OTHER_VAR_KEPT") == "1"  # only the run's variables are purged


def test_purge_on_a_class_covers_its_tests_and_subclasses():
    @utils.purge_accelerate_environment
    class Base(unittest.TestCase):
        def test_a(self):
            os.environ["ACCELERATE_FROM_A"] = "1"

        def helper(self):
            os.environ["ACCELERATE_FROM_HELPER"] = "1"

    class Child(Base):
        def test_b(self):
            os.environ["ACCELERATE_FROM_B"] = "1"

    Child("test_a").test_a()
    Child("test_b").test_b()
    Base("test_a").helper()
    assert "ACCELERATE_FROM_A" not in os.environ and "ACCELERATE_FROM_B" not in os.environ
    assert os.environ.pop("ACCELERATE_FROM_HELPER") == "1"  # not a test method: left alone


@pytest.mark.parametrize("env, expected", [
    ({"A": "1", "B": "two"}, ["A=1\n", "B=two\n"]),
    ({"BAD": "<x", "OK": "y"}, ["OK=y\n"]),
    ({"SPACE": "a b", "SEMI": "a;b", "NL": "a\nb", "GT": "a>b"}, []),
    ({"": "v", "EMPTY": ""}, []),
])
def test_convert_dict_to_env_variables(env, expected):
    assert utils.convert_dict_to_env_variables(env) == expected


@pytest.mark.parametrize("env, expected", [
    ({}, CPUInformation(0, 1, 0, 1)),
    ({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}, CPUInformation(3, 8, 1, 4)),
    ({"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2"}, CPUInformation(2, 4, 0, 2)),
    ({"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "6", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
      "OMPI_COMM_WORLD_LOCAL_SIZE": "3"}, CPUInformation(5, 6, 1, 3)),
    ({"MV2_COMM_WORLD_RANK": "1", "MV2_COMM_WORLD_SIZE": "2"}, CPUInformation(1, 2, 0, 1)),
])
def test_cpu_distributed_information(env, expected):
    with utils.clear_environment(), utils.patch_environment(**env):
        assert utils.get_cpu_distributed_information() == expected


def test_device_facts_on_a_machine_without_gpus():
    if shutil.which("nvidia-smi") or utils.is_cuda_available():
        pytest.skip("this machine has NVIDIA GPUs")
    assert utils.get_current_device_type() == ("cuda", "MULTI_GPU")  # Accelerate's answer when nothing else is found
    assert utils.check_cuda_fp8_capability() is False  # Accelerate raises here
    assert utils.check_cuda_p2p_ib_support() is True
    with pytest.raises(OSError):
        utils.get_gpu_info()
    before = os.sched_getaffinity(0)
    utils.set_numa_affinity(0)
    assert os.sched_getaffinity(0) == before


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this platform")
def test_set_numa_affinity_pins_a_gpu_process_to_its_gpus_node(tmp_path, monkeypatch):
    """Accelerate's `override_numa_affinity` and `--enable_cpu_affinity` share one implementation: the GPU's
    PCI address -> its sysfs NUMA node -> that node's CPUs (here a fake sysfs whose GPU sits on node 1)."""
    import torch

    from hasten.distributed import numa

    before = os.sched_getaffinity(0)
    first = min(before)
    for index, cpus in enumerate(["100000", str(first)]):
        folder = tmp_path / "devices" / "system" / "node" / f"node{index}"
        folder.mkdir(parents=True)
        (folder / "cpulist").write_text(cpus + "\n")
    gpu = tmp_path / "bus" / "pci" / "devices" / "0000:3b:00.0"
    gpu.mkdir(parents=True)
    (gpu / "numa_node").write_text("1\n")
    monkeypatch.setattr(numa, "SYSFS", str(tmp_path))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    asked = []
    monkeypatch.setattr(numa, "pci_bus_id", lambda device: asked.append(device) or "0000:3B:00.0")
    try:
        override_numa_affinity(0, verbose=True)
        assert asked == [torch.device("cuda", 0)]  # the process's own GPU, by its local index
        assert os.sched_getaffinity(0) == {first}  # the GPU's node 1, not node 0 that local index 0 would spread to
        (gpu / "numa_node").write_text("-1\n")  # the kernel does not know the GPU's node: left alone
        os.sched_setaffinity(0, before)
        override_numa_affinity(1)
        assert os.sched_getaffinity(0) == before
    finally:
        os.sched_setaffinity(0, before)


def test_are_libraries_initialized():
    assert utils.are_libraries_initialized("os", "surely_not_a_module_name") == ["os"]


# -- launch helpers -------------------------------------------------------------------------------------------------
def _args(*argv):
    return launch_command_parser().parse_args(list(argv))


@pytest.fixture
def no_config(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # no default config file
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)


def test_simple_launcher_command_and_environment(no_config):
    command, env = utils.prepare_simple_launcher_cmd_env(_args("--cpu", "--mixed_precision", "bf16", "train.py", "--lr", "1"))
    assert command == [sys.executable, "train.py", "--lr", "1"]
    assert env["HASTEN_MIXED_PRECISION"] == "bf16" and env["HASTEN_USE_CPU"] == "true"
    assert env["PATH"] == os.environ["PATH"]  # the caller's environment is carried over
    command, _ = utils.prepare_simple_launcher_cmd_env(_args("-m", "pkg.train"))
    assert command == [sys.executable, "-m", "pkg.train"]
    command, _ = utils.prepare_simple_launcher_cmd_env(_args("--no_python", "./run.sh", "x"))
    assert command == ["./run.sh", "x"]
    with pytest.raises(ConfigError, match="--module and --no_python"):
        utils.prepare_simple_launcher_cmd_env(_args("-m", "--no_python", "x"))


def test_multi_gpu_env_fills_torchruns_options(no_config):
    args = _args("--cpu", "--num_processes", "4", "--num_machines", "2", "--machine_rank", "1",
                 "--main_process_ip", "10.0.0.1", "--main_process_port", "1234", "train.py")
    env = utils.prepare_multi_gpu_env(args)
    assert (args.nproc_per_node, args.nnodes, args.node_rank) == ("2", "2", 1)
    assert (args.master_addr, args.master_port, args.rdzv_backend) == ("10.0.0.1", "1234", "static")
    assert env["HASTEN_USE_CPU"] == "true"


def test_prepare_for_launch_sets_ranks(monkeypatch):
    monkeypatch.setenv("NPROC", "2")
    monkeypatch.setenv("NODE_RANK", "1")
    for key in ("RANK", "LOCAL_RANK", "FORK_LAUNCHED"):
        # setenv first so monkeypatch records the key and removes what PrepareForLaunch sets; a bare delenv of an
        # absent key records nothing, and FORK_LAUNCHED=1 then leaked into every later launch of the session
        monkeypatch.setenv(key, "")
        monkeypatch.delenv(key)
    seen = []
    launcher = utils.PrepareForLaunch(lambda *a: seen.append(a) or "result", distributed_type="MULTI_CPU")
    assert launcher(1, "x", 2) == "result"
    assert seen == [("x", 2)]
    assert (os.environ["LOCAL_RANK"], os.environ["RANK"], os.environ["FORK_LAUNCHED"]) == ("1", "3", "1")
    monkeypatch.delenv("RANK")
    utils.PrepareForLaunch(lambda: None)(0)  # "NO": ranks are not touched
    assert "RANK" not in os.environ
    with pytest.raises(ValueError):
        utils.PrepareForLaunch(print, distributed_type="NOT_A_TYPE")


def _debug_worker(result_dir):
    import torch
    import torch.distributed as dist

    value = torch.tensor([dist.get_rank() + 1.0])
    dist.all_reduce(value)
    with open(os.path.join(result_dir, f"rank{dist.get_rank()}"), "w") as handle:
        handle.write(str(value.item()))
    dist.destroy_process_group()


def test_prepare_for_launch_debug_joins_a_real_gloo_group(tmp_path, monkeypatch):
    import torch.multiprocessing as mp

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("ACCELERATE_DEBUG_RDV_FILE", str(tmp_path / "rdv"))
    launcher = utils.PrepareForLaunch(_debug_worker, debug=True)
    mp.start_processes(launcher, args=(str(tmp_path),), nprocs=2, start_method="fork")
    assert [(tmp_path / f"rank{r}").read_text() for r in (0, 1)] == ["3.0", "3.0"]


def test_prepare_for_launch_debug_says_what_is_missing(monkeypatch):
    monkeypatch.delenv("ACCELERATE_DEBUG_RDV_FILE", raising=False)
    with pytest.raises(ConfigError, match="ACCELERATE_DEBUG_RDV_FILE"):
        utils.PrepareForLaunch(print, debug=True)(0)


def test_env_var_path_add(monkeypatch):
    monkeypatch.setenv("SOME_PATHS", "/a:/b")
    assert env_var_path_add("SOME_PATHS", "/c") == "/a:/b:/c"
    assert os.environ["SOME_PATHS"] == "/a:/b"
    monkeypatch.delenv("SOME_PATHS")
    assert env_var_path_add("SOME_PATHS", "/c") == "/c"


def test_multi_gpu_env_takes_a_hand_made_namespace_and_picks_a_free_port(no_config):
    import argparse

    # Accelerate's fields only, as Accelerate's own tests build it; port 0 means "pick a free one"
    args = argparse.Namespace(num_processes=1, num_machines=1, main_process_ip="127.0.0.1", main_process_port=0,
                              machine_rank=0, module=False, no_python=False, debug=False, gpu_ids="all",
                              mixed_precision="no", use_fsdp=False, use_megatron_lm=False, same_network=False)
    utils.prepare_multi_gpu_env(args)
    assert args.master_port.isdigit() and args.master_port != "0"
    assert not utils.is_port_in_use(int(args.master_port))


def test_a_namespace_with_accelerates_fill_ins_for_switched_off_features_is_accepted(no_config):
    import argparse

    # Accelerate's parser fills Megatron-LM's and FSDP's flags in; it reads none of them while the switch is off
    def namespace(**changes):
        fields = dict(num_processes=1, num_machines=1, main_process_ip="127.0.0.1", main_process_port=0,
                      machine_rank=0, module=False, no_python=False, debug=False, gpu_ids="all", mixed_precision="no",
                      use_fsdp=False, fsdp_min_num_params=0, fsdp_reshard_after_forward=False, use_megatron_lm=False,
                      megatron_lm_tp_degree=1, megatron_lm_pp_degree=1, megatron_lm_gradient_clipping=1.0,
                      megatron_lm_num_micro_batches=None, same_network=False)
        return argparse.Namespace(**{**fields, **changes})

    args = namespace()
    utils.prepare_multi_gpu_env(args)
    assert args.master_port.isdigit()
    # a value that asks for something is refused while its switch is off, and exported once it is on
    with pytest.raises(ConfigError, match="--megatron_lm_tp_degree needs --use_megatron_lm"):
        utils.prepare_multi_gpu_env(namespace(megatron_lm_tp_degree=2))
    env = utils.prepare_multi_gpu_env(namespace(use_megatron_lm=True))
    assert env["HASTEN_USE_MEGATRON_LM"] == "true" and env["MEGATRON_LM_TP_DEGREE"] == "1"
    with pytest.raises(ConfigError, match="--fsdp_min_num_params needs --use_fsdp"):
        utils.prepare_multi_gpu_env(namespace(fsdp_min_num_params=1000))


def test_an_old_linux_kernel_is_logged_with_both_versions(monkeypatch, caplog):
    import platform
    from types import SimpleNamespace

    from hasten.utils import check_os_kernel

    monkeypatch.setattr(platform, "uname", lambda: SimpleNamespace(system="Linux", release="5.4.0-35-generic"))
    with caplog.at_level("WARNING"):
        check_os_kernel()
    assert len(caplog.records) == 1 and "5.4.0" in caplog.records[0].msg and "5.5.0" in caplog.records[0].msg
    caplog.clear()
    for system, release in (("Linux", "5.15.0-35-generic"), ("Darwin", "5.4.0"), ("Linux", "custom+build")):
        monkeypatch.setattr(platform, "uname", lambda s=system, r=release: SimpleNamespace(system=s, release=r))
        check_os_kernel()
    assert not caplog.records


def test_env_file_entries_left_out_are_logged_under_accelerates_module_path(caplog):
    with caplog.at_level("WARNING", logger="hasten.utils.environment"):
        assert utils.convert_dict_to_env_variables({"A": "1", "B": "<x"}) == ["A=1\n"]
    assert [record.name for record in caplog.records] == ["hasten.utils.environment"]
