"""ParallelismConfig (Accelerate 1.15's fields, sizes, dimension names, environment) and what hasten runs of it:
dp_shard alone -> FSDP2, dp_replicate alone -> DDP; tensor/context parallelism and HSDP refused in one line."""

from __future__ import annotations

import dataclasses

import pytest

from hasten import Accelerator, ParallelismConfig
from hasten.commands.launch import launch_command_parser, plan_launch
from hasten.config.fsdp import FullyShardedDataParallelPlugin
from hasten.core.errors import ConfigError, NotBuiltError
from hasten.parallelism_config import (
    TorchContextParallelConfig,
    TorchTensorParallelConfig,
    TorchTensorParallelPlugin,
)
from hasten.plan.layout import backend_for_layout, config_for_run
from launching import launch

SIZE_VARIABLES = ("DP_REPLICATE_SIZE", "DP_SHARD_SIZE", "TP_SIZE", "CP_SIZE", "CP_BACKEND", "CP_COMM_STRATEGY",
                  "SP_SIZE", "SP_BACKEND")


@pytest.fixture(autouse=True)
def no_layout_variables(monkeypatch):
    for name in SIZE_VARIABLES:
        monkeypatch.delenv(f"PARALLELISM_CONFIG_{name}", raising=False)


def _one_line(error) -> str:
    text = str(error.value)
    assert "\n" not in text, text
    return text


def test_fields_and_defaults_are_accelerates():
    names = [f.name for f in dataclasses.fields(ParallelismConfig) if not f.name.startswith("_")]
    assert names == ["dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "cp_backend", "sp_size",
                     "sp_backend", "tp_handler", "cp_handler", "sp_handler",
                     "pp_size", "pp_handler"]  # the last two are hasten's (pipeline parallelism), after Accelerate's
    config = ParallelismConfig()
    assert (config.dp_replicate_size, config.dp_shard_size, config.tp_size, config.cp_size, config.sp_size) == (1,) * 5
    assert (config.cp_backend, config.sp_backend) == ("torch", "deepspeed")
    assert config.tp_handler is None and config.cp_handler is None and ParallelismConfig.device_mesh is None
    assert config.total_size == 1 and config.active_mesh_dims == [] and config.fsdp_dim_names == ["dp_shard_cp"]
    assert TorchTensorParallelConfig().enable_async_tp is False
    assert TorchContextParallelConfig().cp_comm_strategy == "allgather"
    assert (TorchTensorParallelPlugin().tp_size, TorchTensorParallelPlugin().torch_device_mesh) == (1, None)


def test_sizes_and_dimension_names():
    config = ParallelismConfig(dp_replicate_size=2, dp_shard_size=2, tp_size=2, cp_size=3)
    assert (config.total_size, config.data_parallel_size, config.non_data_parallel_size) == (24, 4, 6)
    assert config.dp_replicate_enabled and config.dp_shard_enabled and config.tp_enabled and config.cp_enabled
    assert not config.sp_enabled
    assert config.dp_dim_names == ["dp_replicate", "dp_shard"]
    assert config.non_dp_dim_names == ["tp", "cp"]
    assert config.dp_shard_cp_dim_names == ["dp_shard", "cp"]
    assert config.dp_cp_dim_names == ["dp_replicate", "dp_shard", "cp"]
    assert config.fsdp_dim_names == ["dp_replicate", "dp_shard_cp"]
    assert config.active_mesh_dims == ["dp_replicate", "dp_shard", "tp", "cp"]
    assert isinstance(config.tp_handler, TorchTensorParallelConfig)  # made when the size is above 1
    assert isinstance(config.cp_handler, TorchContextParallelConfig)
    assert ParallelismConfig(dp_shard_size=4).fsdp_dim_names == ["dp_shard_cp"]


def test_to_json_returns_the_sizes():  # Accelerate's returns None
    data = ParallelismConfig(dp_shard_size=2, cp_size=2).to_json()
    assert data["dp_shard_size"] == 2 and data["cp_handler"] == {"cp_comm_strategy": "allgather"}
    assert "device_mesh" not in data


def test_sizes_are_read_from_the_environment_and_code_wins(monkeypatch):
    monkeypatch.setenv("PARALLELISM_CONFIG_DP_SHARD_SIZE", "2")
    monkeypatch.setenv("PARALLELISM_CONFIG_TP_SIZE", "4")
    monkeypatch.setenv("PARALLELISM_CONFIG_CP_COMM_STRATEGY", "alltoall")
    config = ParallelismConfig(cp_size=2)
    assert (config.dp_shard_size, config.tp_size, config.cp_size) == (2, 4, 2)
    assert config.cp_handler.cp_comm_strategy == "alltoall"
    assert ParallelismConfig(tp_size=1).tp_size == 1
    for name, value in {"DP_REPLICATE_SIZE": "3", "CP_SIZE": "2", "PP_SIZE": "2", "PP_SCHEDULE": "GPipe"}.items():
        monkeypatch.setenv(f"PARALLELISM_CONFIG_{name}", value)
    config = ParallelismConfig()
    assert (config.dp_replicate_size, config.cp_size, config.pp_size, config.pp_handler.schedule) == (3, 2, 2, "GPipe")


@pytest.mark.parametrize("variable, text, expected", [
    ("PARALLELISM_CONFIG_DP_SHARD_SIZE", "two", "PARALLELISM_CONFIG_DP_SHARD_SIZE='two'"),
    ("PARALLELISM_CONFIG_TP_SIZE", "0", "a whole number of 1 or more"),
    ("PARALLELISM_CONFIG_CP_BACKEND", "ring", "torch"),
    ("PARALLELISM_CONFIG_SP_BACKEND", "ring", "PARALLELISM_CONFIG_SP_BACKEND='ring'"),
])
def test_a_bad_or_unbuilt_variable_is_one_line(monkeypatch, variable, text, expected):
    monkeypatch.setenv(variable, text)
    with pytest.raises(ConfigError) as error:
        ParallelismConfig()
    assert expected in _one_line(error)


@pytest.mark.parametrize("kwargs, expected", [
    (dict(dp_shard_size=0), "dp_shard_size=0"),
    (dict(tp_size=1.5), "tp_size=1.5"),
    (dict(cp_size=2, sp_size=2), "are mutually exclusive"),
    (dict(cp_backend="ring"), "must be 'torch'"),
    (dict(sp_backend="ulysses"), "sp_backend must be one of ['deepspeed'], but got ulysses"),
])
def test_invalid_sizes_are_one_line(kwargs, expected):
    with pytest.raises(ConfigError) as error:
        ParallelismConfig(**kwargs)
    assert expected in _one_line(error)


def test_handler_options_not_built_are_refused(monkeypatch):
    # enable_async_tp: as Accelerate, a warning in its words and the option ignored; refused under strict
    with pytest.warns(UserWarning, match="Async tensor parallelism is currently not supported, ignoring this option."):
        TorchTensorParallelConfig(enable_async_tp=True)
    monkeypatch.setenv("HASTEN_STRICT", "1")
    with pytest.raises(NotBuiltError) as error:
        TorchTensorParallelConfig(enable_async_tp=True)
    assert "async tensor parallelism" in _one_line(error) and "strict" in _one_line(error)
    monkeypatch.delenv("HASTEN_STRICT")
    with pytest.raises(ConfigError) as error:
        TorchContextParallelConfig(cp_comm_strategy="ring")
    assert "allgather, alltoall" in _one_line(error)
    assert _one_line(error).startswith("Invalid cp_comm_strategy: ring")  # Accelerate's words first


def test_a_bad_comm_strategy_from_the_environment_names_it_in_accelerates_words(monkeypatch):
    monkeypatch.setenv("PARALLELISM_CONFIG_CP_COMM_STRATEGY", "invalid")
    with pytest.raises(ValueError) as error:
        TorchContextParallelConfig()
    assert _one_line(error).startswith("Invalid cp_comm_strategy: invalid")
    assert "PARALLELISM_CONFIG_CP_COMM_STRATEGY" in _one_line(error)


@pytest.mark.parametrize("kwargs, processes, backend", [
    ({}, 1, "single"),
    ({}, 4, "ddp"),  # all sizes 1 on many processes: replicate over all of them, as Accelerate does
    (dict(dp_replicate_size=2), 2, "ddp"),
    (dict(dp_shard_size=4), 4, "fsdp"),
    (dict(dp_replicate_size=2, dp_shard_size=2), 4, "fsdp"),  # HSDP: FSDP2 over a 2-D mesh
    (dict(tp_size=2), 2, "tensor_parallel"),
    (dict(dp_shard_size=2, tp_size=2), 4, "tensor_parallel"),
    (dict(dp_replicate_size=2, tp_size=2), 4, "tensor_parallel"),  # Accelerate refuses it; hasten replicates
    (dict(dp_shard_size=2, cp_size=2), 4, "tensor_parallel"),  # on CUDA (no device type given here)
])
def test_layouts_hasten_runs(kwargs, processes, backend):
    config = ParallelismConfig(**kwargs)
    assert backend_for_layout(config, processes) == backend
    assert config.total_size == processes


@pytest.mark.parametrize("kwargs, processes, error, expected", [
    (dict(dp_shard_size=2), 3, ConfigError, "sizes multiply to 2 (dp_shard_size=2) but this run has 3 process"),
    (dict(sp_size=2), 2, ConfigError, "sp_size=2 with sp_backend='deepspeed' needs DeepSpeed"),
])
def test_layouts_hasten_refuses_in_one_line(kwargs, processes, error, expected):
    with pytest.raises(error) as raised:
        backend_for_layout(ParallelismConfig(**kwargs), processes)
    assert expected in _one_line(raised)


def test_context_parallelism_on_cpu_is_refused_with_the_reason():
    with pytest.raises(NotBuiltError) as raised:
        backend_for_layout(ParallelismConfig(dp_shard_size=2, cp_size=2), 4, device_type="cpu")
    text = _one_line(raised)
    assert "cp_size=2 on cpu" in text and "needs CUDA" in text and "no sharding strategy" in text


def test_an_fsdp1_plugin_cannot_shard_a_layout():
    with pytest.raises(ConfigError) as error:
        backend_for_layout(ParallelismConfig(dp_shard_size=2), 2, FullyShardedDataParallelPlugin(fsdp_version=1))
    assert "fsdp_version=2" in _one_line(error)
    with pytest.raises(ConfigError) as error:
        backend_for_layout(ParallelismConfig(dp_replicate_size=2), 2, FullyShardedDataParallelPlugin(fsdp_version=2))
    assert "no dimension to shard over" in _one_line(error)
    with pytest.raises(ConfigError) as error:
        backend_for_layout(ParallelismConfig(dp_shard_size=2), 2, deepspeed=True)
    assert "DeepSpeed plugin is given, which shards by its ZeRO stage" in _one_line(error)
    with pytest.raises(ConfigError) as error:  # FSDP1 (its HYBRID_SHARD diverges on CPU) never runs a layout
        backend_for_layout(ParallelismConfig(tp_size=2), 2, FullyShardedDataParallelPlugin(fsdp_version=1))
    assert "fsdp_version=2" in _one_line(error)
    assert backend_for_layout(ParallelismConfig(dp_replicate_size=2), 2, deepspeed=True) == "deepspeed"


def test_the_environment_turns_the_config_on(monkeypatch):
    assert config_for_run(None) is None
    monkeypatch.setenv("PARALLELISM_CONFIG_DP_SHARD_SIZE", "2")  # a size alone is honoured, not ignored
    assert config_for_run(None).dp_shard_size == 2
    monkeypatch.delenv("PARALLELISM_CONFIG_DP_SHARD_SIZE")
    monkeypatch.setenv("ACCELERATE_USE_PARALLELISM_CONFIG", "true")
    assert config_for_run(None).total_size == 1


def test_one_process_accelerator_has_the_config_and_no_mesh():
    config = ParallelismConfig()
    accelerator = Accelerator(cpu=True, parallelism_config=config)
    assert accelerator.parallelism_config is config and accelerator.torch_device_mesh is None
    assert (accelerator.tensor_parallel_rank, accelerator.data_parallel_rank, accelerator.data_parallel_shard_rank,
            accelerator.context_parallel_rank) == (0, 0, 0, 0)


def test_rank_properties_need_a_config():
    accelerator = Accelerator(cpu=True)
    assert accelerator.parallelism_config is None and accelerator.torch_device_mesh is None
    with pytest.raises(ConfigError) as error:
        accelerator.tensor_parallel_rank
    assert "parallelism_config" in _one_line(error)


def test_one_process_refuses_a_layout_for_two():
    with pytest.raises(ConfigError) as error:
        Accelerator(cpu=True, parallelism_config=ParallelismConfig(dp_shard_size=2))
    assert "multiply to 2" in _one_line(error) and "1 process" in str(error.value)


def _plan(*flags):
    return plan_launch(launch_command_parser().parse_args([*flags, "train.py"]))


def test_launch_flags_reach_the_processes_and_set_their_number():
    plan = _plan("--cpu", "--parallelism_config_dp_shard_size", "2")
    assert plan.num_processes == 2 and plan.env["PARALLELISM_CONFIG_DP_SHARD_SIZE"] == "2"
    with pytest.raises(ConfigError) as error:
        _plan("--cpu", "--num_processes", "3", "--parallelism_config_dp_replicate_size", "2")
    assert "multiply to 2 but num_processes is 3" in _one_line(error)
    plan = _plan("--cpu", "--parallelism_config_tp_size", "2")
    assert plan.num_processes == 2 and plan.env["PARALLELISM_CONFIG_TP_SIZE"] == "2"
    with pytest.raises(NotBuiltError) as error:  # refused before any process starts, with the measured reason
        _plan("--cpu", "--parallelism_config_cp_size", "2")
    assert "cp_size=2 on CPU processes: context parallelism needs CUDA GPUs" in _one_line(error)


def test_the_config_file_block_reaches_the_run(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_CPU\nnum_processes: 2\n"
                    "parallelism_config:\n  parallelism_config_tp_size: 2\n")
    # was accepted and silently ignored; now it reaches the processes (tests/workers/tp_layouts.py trains with it)
    assert _plan("--config_file", str(path)).env["PARALLELISM_CONFIG_TP_SIZE"] == "2"
    path.write_text(path.read_text().replace("tp_size", "dp_shard_size"))
    assert _plan("--config_file", str(path)).env["PARALLELISM_CONFIG_DP_SHARD_SIZE"] == "2"


def test_layouts_on_two_processes():
    """dp_shard=2 (from the launch flag) trains with FSDP2, dp_replicate=2 with DDP, both equal to one process;
    rank properties read the mesh; CP on CPU refused in one line (tests/workers/parallelism_layouts.py)."""
    result = launch("parallelism_layouts.py", flags=("--parallelism_config_dp_shard_size", "2"), timeout=300)
    assert result.stdout.count("parallelism layout checks passed") == 2, result.stdout


def test_build_device_mesh_slices_flattened_views_by_lists_of_names(monkeypatch):
    # Accelerate slices `mesh[list_of_names]`; code (and tests) that stand in a recording mesh see lists
    import torch.distributed.device_mesh as device_mesh

    from hasten.parallelism_config import ParallelismConfig

    class RecordingMesh:
        def __init__(self):
            self.sliced = []

        def __getitem__(self, names):
            self.sliced.append(names)
            return self

        def _flatten(self, name):
            return name

    mesh = RecordingMesh()
    monkeypatch.setattr(device_mesh, "init_device_mesh", lambda *args, **kwargs: mesh)
    ParallelismConfig(dp_replicate_size=2, dp_shard_size=2).build_device_mesh("cpu")
    assert mesh.sliced and all(type(names) is list for names in mesh.sliced), mesh.sliced


def test_handler_fields_that_only_warn_or_reach_torch_are_seen(monkeypatch):
    """enable_async_tp warns and runs without (as Accelerate); a mesh given to the deprecated plugin is replaced by
    the run's (as Accelerate, said in a warning); cp_comm_strategy is the rotate method torch's context parallelism
    is given (the CPU part: context parallelism runs on CUDA only)."""
    import contextlib
    from types import SimpleNamespace

    import torch.distributed.tensor.experimental as experimental
    import torch.distributed.tensor.experimental._attention as attention

    from hasten.distributed.context_parallel import maybe_context_parallel

    with pytest.warns(UserWarning, match="Async tensor parallelism is currently not supported"):
        TorchTensorParallelConfig(enable_async_tp=True)
    with pytest.warns(UserWarning, match=r"torch_device_mesh=\.\.\.\) is not used"):
        TorchTensorParallelPlugin(tp_size=2, torch_device_mesh=object())
    rotations = []
    monkeypatch.setattr(attention, "set_rotate_method", rotations.append)
    monkeypatch.setattr(experimental, "context_parallel", lambda mesh, **kwargs: contextlib.nullcontext())
    layout = SimpleNamespace(cp_enabled=True, cp_handler=TorchContextParallelConfig(cp_comm_strategy="alltoall"),
                             submesh=lambda name: None)
    with maybe_context_parallel(SimpleNamespace(parallelism_config=layout)):
        pass
    assert rotations == ["alltoall"]  # the default is allgather
