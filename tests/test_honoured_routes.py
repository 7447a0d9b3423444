"""Routes of settings and arguments no other test showed taking effect (issue: accepted means honoured, proven by
mutants; docs/honoured.md): each test fails when its entry is dropped (`python scripts/prove_honoured.py <entry>`)."""

from __future__ import annotations

import os

import pytest
import torch

from hasten import Accelerator
from hasten.commands.launch import launch_command_parser
from hasten.config.launch_settings import resolve_launch
from launching import launch


def _exports(*flags) -> dict:
    return resolve_launch(launch_command_parser().parse_args([*flags, "train.py"]), env={}).env


def test_enable_cpu_affinity_through_the_launcher_pins_every_process(tmp_path):
    pinned = launch("cpu_affinity.py", flags=["--enable_cpu_affinity"], timeout=240).stdout
    assert "RANK 0 PINNED 1" in pinned and "RANK 1 PINNED 1" in pinned, pinned
    unpinned = launch("cpu_affinity.py", timeout=240).stdout
    assert "RANK 0 PINNED 0" in unpinned and "RANK 1 PINNED 0" in unpinned, unpinned


def test_prepare_device_placement_list_leaves_that_object_where_it_is():
    # A model still on the meta device cannot be placed; device_placement=[False] tells prepare() not to try.
    accelerator = Accelerator(cpu=True)
    with torch.device("meta"):
        kept = torch.nn.Linear(2, 2)
    prepared = accelerator.prepare(kept, device_placement=[False])
    assert prepared.weight.is_meta
    with torch.device("meta"):
        placed = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="meta device"):
        accelerator.prepare(placed)


@pytest.mark.parametrize("variables", [
    {"ACCELERATE_DYNAMO_BACKEND": "inductor", "ACCELERATE_DYNAMO_USE_FULLGRAPH": "true",
     "ACCELERATE_DYNAMO_USE_DYNAMIC": "true"},
    {"HASTEN_DYNAMO_BACKEND": "inductor", "HASTEN_DYNAMO_USE_FULLGRAPH": "true", "HASTEN_DYNAMO_USE_DYNAMIC": "true"},
])
def test_dynamo_variables_reach_torch_compile(monkeypatch, variables):
    import hasten.training.compilation as compilation

    calls = []
    monkeypatch.setattr(compilation.torch, "compile", lambda model, **kwargs: calls.append(kwargs) or model)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    Accelerator().prepare(torch.nn.Linear(2, 2))
    assert [(c["backend"], c["fullgraph"], c["dynamic"]) for c in calls] == [("inductor", True, True)], calls


def test_dynamo_flags_are_exported_for_the_processes():
    exported = _exports("--dynamo_backend", "inductor", "--dynamo_use_fullgraph", "--dynamo_use_dynamic")
    assert (exported.get("HASTEN_DYNAMO_USE_FULLGRAPH"), exported.get("HASTEN_DYNAMO_USE_DYNAMIC")) == ("true", "true")


def test_fsdp_ignored_modules_variable_picks_the_modules_fsdp_leaves_alone(monkeypatch):
    from hasten.backends.fsdp.backend import _ignored_modules
    from hasten.utils import FullyShardedDataParallelPlugin

    model = torch.nn.Sequential()
    model.add_module("body", torch.nn.Linear(2, 2))
    model.add_module("head", torch.nn.Linear(2, 2))
    monkeypatch.setenv("FSDP_IGNORED_MODULES", "head")
    plugin = FullyShardedDataParallelPlugin()
    assert _ignored_modules(model, plugin.ignored_modules) == [model.head]


def test_pp_microbatches_flag_and_variable_reach_the_pipeline_config(monkeypatch):
    from hasten.parallelism_config import TorchPipelineParallelConfig

    exported = _exports("--parallelism_config_pp_size", "2", "--parallelism_config_pp_microbatches", "4",
                        "--num_processes", "2")
    assert exported.get("PARALLELISM_CONFIG_PP_MICROBATCHES") == "4"
    monkeypatch.setenv("PARALLELISM_CONFIG_PP_MICROBATCHES", "4")
    assert TorchPipelineParallelConfig().microbatches == 4


def test_save_state_safe_serialization_false_writes_torch_files(tmp_path):
    accelerator = Accelerator(cpu=True)
    accelerator.prepare(torch.nn.Linear(2, 2))
    accelerator.save_state(tmp_path / "safe")
    safe = set(os.listdir(tmp_path / "safe"))
    accelerator.save_state(tmp_path / "pickled", safe_serialization=False)
    pickled = set(os.listdir(tmp_path / "pickled"))
    assert "model.safetensors" in safe and "pytorch_model.bin" not in safe, safe
    assert "pytorch_model.bin" in pickled and "model.safetensors" not in pickled, pickled


FSDP1_GIVEN = {  # plugin argument -> (its variable and text, what FullyShardedDataParallel must be given)
    "sharding_strategy": ("FSDP_SHARDING_STRATEGY", "SHARD_GRAD_OP", "sharding_strategy", "SHARD_GRAD_OP"),
    "backward_prefetch": ("FSDP_BACKWARD_PREFETCH", "BACKWARD_POST", "backward_prefetch", "BACKWARD_POST"),
    "use_orig_params": ("FSDP_USE_ORIG_PARAMS", "true", "use_orig_params", True),  # without: False, for FSDP1
}


@pytest.mark.parametrize("route", ["argument", "variable"])
def test_fsdp1_plugin_values_reach_the_wrapper_in_one_process(monkeypatch, route):
    """One process (FSDP with a world of one): the values FullyShardedDataParallel is built with, from the plugin's
    arguments or from the launcher's FSDP_* variables."""
    import warnings

    import torch.distributed.fsdp as fsdp

    from hasten.utils import FullyShardedDataParallelPlugin

    given = []

    class Recording(fsdp.FullyShardedDataParallel):
        def __init__(self, module, **kwargs):
            given.append(kwargs)
            super().__init__(module, **kwargs)

    monkeypatch.setattr(fsdp, "FullyShardedDataParallel", Recording)
    arguments = {"fsdp_version": 1, "sync_module_states": False, "cpu_ram_efficient_loading": False}
    if route == "argument":
        arguments.update(sharding_strategy="SHARD_GRAD_OP", backward_prefetch="BACKWARD_POST", use_orig_params=True)
    else:
        for variable, text, _, _ in FSDP1_GIVEN.values():
            monkeypatch.setenv(variable, text)
    import torch.distributed as dist

    had_group = dist.is_initialized()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # deprecations of FSDP1 spellings, as Accelerate's
            Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(**arguments)).prepare(torch.nn.Linear(2, 2))
    finally:
        # the one-process group FSDP made must not outlive the test: later tests fork (debug_launcher), and a
        # forked child that inherits a live gloo group crashes
        if dist.is_initialized() and not had_group:
            dist.destroy_process_group()
    (kwargs,) = given
    seen = {
        "sharding_strategy": kwargs["sharding_strategy"].name,
        "backward_prefetch": getattr(kwargs["backward_prefetch"], "name", None),
        "use_orig_params": kwargs["use_orig_params"],
    }
    assert seen == {key: expected for key, (_, _, _, expected) in FSDP1_GIVEN.items()}, seen


def test_accelerator_device_placement_false_leaves_prepared_models_where_they_are():
    with torch.device("meta"):
        kept = torch.nn.Linear(2, 2)
    assert Accelerator(cpu=True, device_placement=False).prepare(kept).weight.is_meta


DEEPSPEED_FLAGS = [  # (flag, value, the DeepSpeedPlugin attribute, what it must hold) with --use_deepspeed --zero_stage 3
    ("--offload_optimizer_device", "nvme", "offload_optimizer_device", "nvme"),
    ("--offload_param_device", "nvme", "offload_param_device", "nvme"),
    ("--offload_optimizer_nvme_path", "/scratch/opt", "offload_optimizer_nvme_path", "/scratch/opt"),
    ("--offload_param_nvme_path", "/scratch/param", "offload_param_nvme_path", "/scratch/param"),
    ("--zero3_init_flag", "false", "zero3_init_flag", False),  # on by default with ZeRO-3
    ("--zero3_save_16bit_model", "true", "zero3_save_16bit_model", True),
    ("--deepspeed_moe_layer_cls_names", "MoEBlock", "transformer_moe_cls_names", "MoEBlock"),
]


@pytest.mark.parametrize("flag, value, attribute, expected", DEEPSPEED_FLAGS, ids=[f[0] for f in DEEPSPEED_FLAGS])
def test_deepspeed_launch_flags_reach_the_plugin_in_the_processes(monkeypatch, flag, value, attribute, expected):
    """`hasten launch --use_deepspeed <flag> <value>` exports a variable; the DeepSpeedPlugin a launched script
    builds without arguments holds the value."""
    pytest.importorskip("deepspeed")
    from hasten.utils import DeepSpeedPlugin

    exported = _exports("--use_deepspeed", "--zero_stage", "3", flag, value)
    for name, text in exported.items():
        monkeypatch.setenv(name, text)
    plugin = DeepSpeedPlugin()
    assert getattr(plugin, attribute) == expected, (flag, exported)
