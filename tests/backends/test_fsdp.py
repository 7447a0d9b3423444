"""FSDP: the plugin's settings (unit tests) and sharded training/checkpoints in real processes (gloo, CPU)."""

import os
import re
import subprocess
import sys

import pytest
import torch

from launching import launch

from hasten.config.fsdp import FullyShardedDataParallelPlugin
from hasten.core.errors import ConfigError


@pytest.fixture(autouse=True)
def no_fsdp_env():
    """FSDP_* variables from outside (or written by a plugin) must not leak between tests."""
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("FSDP_")}
    yield
    for key in [k for k in os.environ if k.startswith("FSDP_")]:
        del os.environ[key]
    os.environ.update(saved)


# -- the plugin ------------------------------------------------------------------------------------------------
def test_defaults_follow_accelerate_per_version():
    from torch.distributed.fsdp import CPUOffload, OffloadPolicy, ShardingStrategy, StateDictType

    v1 = FullyShardedDataParallelPlugin()
    assert v1.fsdp_version == 1
    assert v1.sharding_strategy == ShardingStrategy.FULL_SHARD
    assert v1.state_dict_type == StateDictType.FULL_STATE_DICT
    assert v1.cpu_offload == CPUOffload(offload_params=False)
    assert (v1.use_orig_params, v1.sync_module_states, v1.auto_wrap_policy) == (False, False, None)
    v2 = FullyShardedDataParallelPlugin(fsdp_version=2)
    assert v2.reshard_after_forward is True
    assert v2.state_dict_type == StateDictType.SHARDED_STATE_DICT
    assert type(v2.cpu_offload) is OffloadPolicy
    assert (v2.use_orig_params, v2.sync_module_states, v2.backward_prefetch) == (None, None, None)


def test_argument_beats_environment_beats_default(monkeypatch):
    monkeypatch.setenv("FSDP_VERSION", "2")
    monkeypatch.setenv("FSDP_RESHARD_AFTER_FORWARD", "false")
    monkeypatch.setenv("FSDP_AUTO_WRAP_POLICY", "TRANSFORMER_BASED_WRAP")
    monkeypatch.setenv("FSDP_TRANSFORMER_CLS_TO_WRAP", "Block, Head")
    monkeypatch.setenv("FSDP_MIN_NUM_PARAMS", "100")
    monkeypatch.setenv("FSDP_STATE_DICT_TYPE", "FULL_STATE_DICT")
    from_env = FullyShardedDataParallelPlugin()
    assert (from_env.fsdp_version, from_env.reshard_after_forward) == (2, False)
    assert from_env.auto_wrap_policy == "transformer_based_wrap"
    assert from_env.transformer_cls_names_to_wrap == ["Block", "Head"]
    assert from_env.min_num_params == 100
    assert from_env.state_dict_type.name == "FULL_STATE_DICT"  # FSDP2's default is SHARDED_STATE_DICT
    assert from_env.sources["fsdp_version"] == "environment variable FSDP_VERSION"
    explicit = FullyShardedDataParallelPlugin(reshard_after_forward=True, min_num_params=5,
                                              state_dict_type="SHARDED_STATE_DICT", cpu_offload=True,
                                              activation_checkpointing=True)
    assert (explicit.reshard_after_forward, explicit.min_num_params) == (True, 5)
    assert explicit.state_dict_type.name == "SHARDED_STATE_DICT" and explicit.activation_checkpointing is True
    assert type(explicit.cpu_offload).__name__ == "CPUOffloadPolicy"  # FSDP2's offload of parameters to the CPU
    assert explicit.sources["min_num_params"] == "argument"


def test_offload_and_checkpointing_variables_reach_the_plugin(monkeypatch):
    """FSDP_OFFLOAD_PARAMS / FSDP_ACTIVATION_CHECKPOINTING / FSDP_ACTIVATION_CHECKPOINTING_OFFLOAD (as `hasten
    launch` exports them) are the plugin's; the last needs FSDP2, as in Accelerate (its words)."""
    monkeypatch.setenv("FSDP_VERSION", "2")
    monkeypatch.setenv("FSDP_OFFLOAD_PARAMS", "true")
    monkeypatch.setenv("FSDP_ACTIVATION_CHECKPOINTING", "true")
    plugin = FullyShardedDataParallelPlugin()
    assert type(plugin.cpu_offload).__name__ == "CPUOffloadPolicy" and plugin.activation_checkpointing is True
    assert plugin.activation_checkpointing_offload is False
    monkeypatch.setenv("FSDP_ACTIVATION_CHECKPOINTING_OFFLOAD", "true")
    assert FullyShardedDataParallelPlugin().activation_checkpointing_offload is True
    monkeypatch.setenv("FSDP_VERSION", "1")
    with pytest.raises(ConfigError, match="requires `fsdp_version=2`"):
        FullyShardedDataParallelPlugin()


def test_offloads_to_cpu_memory_on_a_cpu_run():
    """On a CPU run (2 processes, tests/workers/fsdp_cpu_offloads.py): cpu_offload under FSDP2 and FSDP1 warns once
    and trains to the weights of the same run without it (torch's offload needs an accelerator: it failed, and
    hasten refused it); hasten's strict setting refuses it in one line; activation_checkpointing_offload wraps
    each checkpointed block in torch's offload wrapper (as Accelerate) and trains to the same weights (it was
    refused as not built)."""
    result = launch("fsdp_cpu_offloads.py", timeout=300)
    for check in ("cpu_offload_fsdp2", "cpu_offload_fsdp1", "activation_offload", "strict"):
        assert result.stdout.count(f"ok {check} rank") == 2, result.stdout[-3000:] + result.stderr[-3000:]


def test_fsdp1_variables_and_the_optimizer_state_config_reach_the_plugin(monkeypatch):
    from torch.distributed.fsdp import FullOptimStateDictConfig

    monkeypatch.setenv("FSDP_VERSION", "1")
    monkeypatch.setenv("FSDP_FORWARD_PREFETCH", "true")
    monkeypatch.setenv("FSDP_SYNC_MODULE_STATES", "true")
    plugin = FullyShardedDataParallelPlugin()
    assert plugin.forward_prefetch is True and plugin.sync_module_states is True  # both default to False
    given = FullyShardedDataParallelPlugin(state_dict_type="FULL_STATE_DICT", optim_state_dict_config=(
        FullOptimStateDictConfig(offload_to_cpu=False, rank0_only=False)))  # the default gathers on rank 0's CPU
    config = given.optim_state_dict_config
    assert (config.offload_to_cpu, config.rank0_only) == (False, False)


def test_launcher_defaults_do_not_break_fsdp2(monkeypatch):
    # `hasten launch --use_fsdp` exports FSDP1-only settings by default (as Accelerate does); FSDP2 ignores them.
    for name, value in {"FSDP_VERSION": "2", "FSDP_USE_ORIG_PARAMS": "true", "FSDP_SYNC_MODULE_STATES": "true",
                        "FSDP_FORWARD_PREFETCH": "false", "FSDP_BACKWARD_PREFETCH": "BACKWARD_PRE"}.items():
        monkeypatch.setenv(name, value)
    plugin = FullyShardedDataParallelPlugin()
    assert (plugin.use_orig_params, plugin.sync_module_states, plugin.backward_prefetch) == (None, None, None)


@pytest.mark.parametrize("kwargs, env, message", [
    ({"fsdp_version": 3}, {}, "fsdp_version=3 (from FullyShardedDataParallelPlugin(...)) must be 1 or 2"),
    ({}, {"FSDP_VERSION": "x"}, "from environment variable FSDP_VERSION"),
    ({"fsdp_version": 2, "sharding_strategy": "FULL_SHARD"}, {}, "reshard_after_forward=True"),
    ({"fsdp_version": 2, "reshard_after_forward": "SHARD_GRAD_OP"}, {}, "use true"),
    ({"fsdp_version": 1, "reshard_after_forward": True}, {}, "give a sharding strategy"),
    ({"fsdp_version": 2, "state_dict_type": "LOCAL_STATE_DICT"}, {}, "use SHARDED_STATE_DICT"),
    ({}, {"FSDP_STATE_DICT_TYPE": "HALF"}, "choose one of FULL_STATE_DICT"),
    ({"auto_wrap_policy": "by_magic"}, {}, "TRANSFORMER_BASED_WRAP, SIZE_BASED_WRAP, NO_WRAP"),
    ({}, {"FSDP_MIN_NUM_PARAMS": "1e8x"}, "min_num_params='1e8x' (from environment variable FSDP_MIN_NUM_PARAMS)"),
    ({}, {"FSDP_OFFLOAD_PARAMS": "maybe"}, "offload_params='maybe'"),
    ({"fsdp_version": 2, "forward_prefetch": True}, {}, "FSDP1 setting"),
    ({"activation_checkpointing_offload": True}, {}, "needs activation_checkpointing=True"),
    ({"mixed_precision_policy": "fp64"}, {}, "choose one of fp32, bf16"),
    ({"fsdp_version": 2, "mixed_precision_policy": {"buffer_dtype": torch.float16}}, {}, "allowed: ['output_dtype'"),
    ({"ignored_modules": "("}, {}, "not a valid regular expression"),
])
def test_bad_values_name_the_setting_and_its_source(monkeypatch, kwargs, env, message):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=re.escape(message)):
        FullyShardedDataParallelPlugin(**kwargs)


def test_mixed_precision_policy_forms():
    from torch.distributed.fsdp import MixedPrecision, MixedPrecisionPolicy

    bf16, fp32 = torch.bfloat16, torch.float32
    v2 = FullyShardedDataParallelPlugin(fsdp_version=2, mixed_precision_policy="bf16")
    assert v2.mixed_precision_policy == MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16, output_dtype=bf16)
    v1 = FullyShardedDataParallelPlugin(mixed_precision_policy={"param_dtype": torch.float16})
    assert isinstance(v1.mixed_precision_policy, MixedPrecision)
    # The run's precision fills the policy only when none was given, as Accelerate does: everything in bf16.
    unset = FullyShardedDataParallelPlugin(fsdp_version=2)
    unset.set_mixed_precision("bf16")
    assert unset.mixed_precision_policy == MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16, output_dtype=bf16)
    unset_v1 = FullyShardedDataParallelPlugin(fsdp_version=1)
    unset_v1.set_mixed_precision("bf16")
    assert unset_v1.mixed_precision_policy == MixedPrecision(param_dtype=bf16, reduce_dtype=bf16, buffer_dtype=bf16)
    # Accelerate's buffer_autocast=True keeps FSDP1 buffers in fp32 (the opposite of its name, kept as is).
    unset_v1.set_mixed_precision("bf16", buffer_autocast=True, override=True)
    assert unset_v1.mixed_precision_policy.buffer_dtype == fp32
    # fp32 gradient reduction: Accelerate's switch, an explicit policy (dict or torch's object), used as given.
    for version, policy_type in ((1, MixedPrecision), (2, MixedPrecisionPolicy)):
        for given in ({"param_dtype": bf16, "reduce_dtype": fp32}, policy_type(param_dtype=bf16, reduce_dtype=fp32)):
            explicit = FullyShardedDataParallelPlugin(fsdp_version=version, mixed_precision_policy=given)
            explicit.set_mixed_precision("bf16")
            assert explicit.mixed_precision_policy == policy_type(param_dtype=bf16, reduce_dtype=fp32)
    v2.set_mixed_precision("fp16")
    assert v2.mixed_precision_policy.param_dtype == torch.bfloat16
    with pytest.raises(ConfigError, match="needs a MixedPrecisionPolicy"):
        FullyShardedDataParallelPlugin(fsdp_version=2, mixed_precision_policy=MixedPrecision())


def test_wrap_policies_pick_blocks():
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(10, 10)

    model = torch.nn.Sequential(Block(), Block(), torch.nn.Linear(10, 2))
    by_class = FullyShardedDataParallelPlugin(auto_wrap_policy="transformer_based_wrap",
                                              transformer_cls_names_to_wrap="Block").wrap_predicate(model)
    assert [by_class(m) for m in model] == [True, True, False]
    by_size = FullyShardedDataParallelPlugin(auto_wrap_policy="size_based_wrap", min_num_params=100)
    assert [by_size.wrap_predicate(model)(m) for m in model] == [True, True, False]
    assert FullyShardedDataParallelPlugin(auto_wrap_policy="size_based_wrap").wrap_predicate(model) is None
    assert FullyShardedDataParallelPlugin().wrap_predicate(model) is None
    with pytest.raises(ConfigError, match=r"names \['Layer'\] but the model has no module of that class"):
        FullyShardedDataParallelPlugin(auto_wrap_policy="transformer_based_wrap",
                                       transformer_cls_names_to_wrap=["Layer"]).wrap_predicate(model)
    with pytest.raises(ConfigError, match="needs transformer_cls_names_to_wrap"):
        FullyShardedDataParallelPlugin(auto_wrap_policy="transformer_based_wrap").wrap_predicate(model)


def test_ram_efficient_loading_is_exported_for_transformers():
    from hasten.utils.fsdp_utils import disable_fsdp_ram_efficient_loading, enable_fsdp_ram_efficient_loading

    FullyShardedDataParallelPlugin(fsdp_version=2, cpu_ram_efficient_loading=True)
    assert os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] == "True"  # Accelerate's spelling, which scripts compare
    FullyShardedDataParallelPlugin(fsdp_version=2, cpu_ram_efficient_loading=False)
    assert os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] == "False"
    enable_fsdp_ram_efficient_loading()
    assert os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] == "True"
    assert FullyShardedDataParallelPlugin().cpu_ram_efficient_loading is True
    disable_fsdp_ram_efficient_loading()
    assert os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] == "False"
    assert FullyShardedDataParallelPlugin(cpu_ram_efficient_loading=True).sync_module_states is True  # FSDP1 needs it


def test_accelerator_selects_fsdp_from_a_plugin_or_the_environment(monkeypatch):
    from hasten import Accelerator
    from hasten.core.enums import DistributedType
    from hasten.state import AcceleratorState

    accelerator = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))
    assert accelerator.distributed_type == DistributedType.FSDP and accelerator.is_fsdp2
    assert accelerator._backend.name == "fsdp"
    AcceleratorState._reset_state(reset_partial_state=True)
    monkeypatch.setenv("HASTEN_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_VERSION", "1")
    accelerator = Accelerator()
    assert accelerator.state.fsdp_plugin.fsdp_version == 1 and not accelerator.is_fsdp2
    assert accelerator.distributed_type == DistributedType.FSDP


# -- real processes --------------------------------------------------------------------------------------------
def test_fsdp_training_matches_ddp():
    """FSDP2/FSDP1 vs DDP vs one process (fp32 1e-5, bf16 5e-3), accumulation, clipping, optimizers, errors."""
    result = launch("fsdp_train.py", timeout=300)
    assert result.stdout.count("fsdp training checks passed") == 2, result.stdout


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    """Save on 2 processes, resume on 1 and save again, resume that on 2 (each phase checks the losses)."""
    root = tmp_path_factory.mktemp("fsdp_resume")
    # The last phase configures FSDP with launch flags only, as `hasten launch --use_fsdp` users do.
    flags = ["--use_fsdp", "--fsdp_version", "2", "--fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP",
             "--fsdp_transformer_layer_cls_to_wrap", "Block"]
    outputs = [launch("fsdp_resume.py", phase, root, num_processes=n, flags=f, timeout=300).stdout
               for phase, n, f in (("save2", 2, ()), ("load1", 1, ()), ("load2", 2, flags))]
    return root, outputs


def test_sharded_checkpoints_resume_on_another_process_count(resumed):
    root, (save2, load1, load2) = resumed
    assert save2.count("save2: rank") == 2 and "load1: rank 0 ok" in load1 and load2.count("load2: rank") == 2
    # Each process wrote its own shard; nothing was gathered into one file.
    assert sorted(os.listdir(root / "ckpt_a" / "pytorch_model_fsdp_0")) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert sorted(os.listdir(root / "ckpt_a" / "optimizer_0")) == [".metadata", "__0_0.distcp", "__1_0.distcp"]


def test_merge_weights_cli(resumed, tmp_path):
    from safetensors.torch import load_file

    root, _ = resumed
    command = [sys.executable, "-m", "hasten", "merge-weights"]
    parent = subprocess.run([*command, str(root / "ckpt_a"), str(tmp_path)], capture_output=True, text=True)
    assert parent.returncode == 1
    assert "is the folder that holds the checkpoints" in parent.stderr and "pytorch_model_fsdp_0" in parent.stderr
    done = subprocess.run([*command, str(root / "ckpt_a" / "pytorch_model_fsdp_0"), str(tmp_path)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    merged = load_file(tmp_path / "model.safetensors")
    expected = load_file(root / "params_a.safetensors")  # the whole model when ckpt_a was saved
    assert merged.keys() == expected.keys()
    assert all(torch.equal(merged[k], expected[k]) for k in merged)


def test_cpu_ram_efficient_loading_keeps_one_copy():
    result = launch("fsdp_memory.py", timeout=300)
    assert result.stdout.count("memory checks passed") == 2, result.stdout
    print(result.stdout.splitlines()[0])


def test_accelerate_import_paths():
    import hasten
    import hasten.utils
    from hasten.backends.fsdp.checkpoint import merge_fsdp_weights

    assert hasten.FullyShardedDataParallelPlugin is FullyShardedDataParallelPlugin
    assert hasten.utils.FullyShardedDataParallelPlugin is FullyShardedDataParallelPlugin
    assert hasten.utils.merge_fsdp_weights is merge_fsdp_weights


def test_materialising_an_offloaded_meta_model_keeps_parameters_on_cpu():
    """Issue 22, item 4: with CPU offload the (sharded) parameters belong in CPU memory and the buffers on the
    device; the meta device stands in for the GPU here (nothing is computed)."""
    from hasten.backends.fsdp.sharding import materialize as _materialize

    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    _materialize(model, torch.device("meta"), offload=True)
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    assert {b.device.type for b in model.buffers()} == {"meta"}
    _materialize(model, torch.device("cpu"), offload=False)
    assert {t.device.type for t in [*model.parameters(), *model.buffers()]} == {"cpu"}


def test_get_module_class_from_name_finds_the_first_class_of_that_name():
    from hasten.utils.dataclasses import get_module_class_from_name
    from hasten.utils.fsdp_utils import get_module_class_from_name as from_fsdp_utils

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), Block())
    assert from_fsdp_utils is get_module_class_from_name
    assert get_module_class_from_name(model, "Block") is Block
    assert get_module_class_from_name(model, "ReLU") is torch.nn.ReLU
    assert get_module_class_from_name(model, "Sequential") is torch.nn.Sequential  # the model itself
    assert get_module_class_from_name(model, "Missing") is None


def test_a_peft_style_auto_wrap_policy_picks_the_named_blocks():
    # what peft's `fsdp_auto_wrap_policy` builds for Trainer: classes found by name, or-ed with a lambda policy
    import functools

    from torch.distributed.fsdp.wrap import _or_policy, lambda_auto_wrap_policy, transformer_auto_wrap_policy

    from hasten.utils.dataclasses import get_module_class_from_name

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 2)
            self.lin.weight.requires_grad_(True)

    model = torch.nn.Sequential(Block(), Block(), Head())
    model._no_split_modules = ["Block"]
    classes = {get_module_class_from_name(model, name) for name in model._no_split_modules}
    policy = functools.partial(_or_policy, policies=[
        functools.partial(lambda_auto_wrap_policy, lambda_fn=lambda m: isinstance(m, Head)),
        functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=classes),
    ])
    predicate = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy=policy).wrap_predicate(model)
    assert [predicate(m) for m in model] == [True, True, True]
    assert predicate(model[0].lin) is False


def test_get_parameters_from_modules_takes_modules_or_a_full_name_pattern():
    from hasten.utils.fsdp_utils import get_parameters_from_modules

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU()))
    assert get_parameters_from_modules(None, model, "cpu") == set()
    assert get_parameters_from_modules([model[0]], model, "cpu") == {model[0].weight, model[0].bias}
    moved = []
    for name, module in model.named_modules():
        module.to = lambda device, name=name, module=module: moved.append((name, device)) or module
    by_pattern = get_parameters_from_modules(r"1\.\d+", model, "cpu")
    assert by_pattern == set(model[1][0].parameters()) and len(by_pattern) == 2
    assert moved == [("1.0", "cpu"), ("1.1", "cpu")]  # matched modules move to the device given
    assert get_parameters_from_modules("1", model, "cpu") == set(model[1].parameters())  # whole names only


def test_fsdp2_prepare_auto_wrap_policy_follows_the_plugin():
    from hasten.utils.fsdp_utils import fsdp2_prepare_auto_wrap_policy

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

    model = torch.nn.Sequential(Block(), torch.nn.Linear(4, 2))
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap",
                                            transformer_cls_names_to_wrap=["Block"])
    policy = fsdp2_prepare_auto_wrap_policy(plugin, model)
    assert [policy(m) for m in model] == [True, False]
    assert fsdp2_prepare_auto_wrap_policy(FullyShardedDataParallelPlugin(fsdp_version=2), model) is None

# -- accepted means honoured (one launch, tests/workers/fsdp_honour.py) ------------------------------------------
@pytest.fixture(scope="module")
def honoured(tmp_path_factory):
    return launch("fsdp_honour.py", tmp_path_factory.mktemp("fsdp_honour"), timeout=300).stdout


@pytest.mark.parametrize("check", ["trigger_sync", "unwrap", "save_kwargs", "load_strict", "rng_missing_step",
                                   "mid_window", "state_dict_config", "use_dcp", "fsdp1_init"])
def test_fsdp_honours(honoured, check):
    """trigger_sync: FSDP2 gradient sync is on again after `trigger_sync_in_backward` (and off again inside
    no_sync); unwrap: get_state_dict(unwrap=False) keeps the compile prefix; save_kwargs: save_state(**kw)
    refused; load_strict: load_state(strict=False) loads with a missing key, strict=True and assign= refused;
    rng_missing_step: a rank without its RNG file takes the others' step; mid_window: save_state inside an
    accumulation window refused; state_dict_config: rank0_only=False gives every rank the state;
    use_dcp: save_fsdp_model/load_fsdp_model(use_dcp=False) per-rank files, named by model_index, in output_dir;
    fsdp1_init: FSDP1 limit_all_gathers=False reaches the wrapper and param_init_fn materialises a meta model."""
    assert honoured.count(f"ok {check} rank") == 2, honoured


def test_fsdp1_only_keys_from_the_environment_warn_under_fsdp2(monkeypatch, caplog):
    """As Accelerate: a warning in its words on its `accelerate.utils.dataclasses` logger (hasten's
    `hasten.utils.dataclasses`, the same logger under the alias), naming where the value came from."""
    import json

    for name, value in {"FSDP_VERSION": "2", "FSDP_USE_ORIG_PARAMS": "true", "FSDP_BACKWARD_PREFETCH": "BACKWARD_PRE",
                        "FSDP_SYNC_MODULE_STATES": "true"}.items():
        monkeypatch.setenv(name, value)
    with caplog.at_level("WARNING", logger="hasten.utils.dataclasses"):
        plugin = FullyShardedDataParallelPlugin()
    assert plugin.backward_prefetch is None
    for words in ("backward_prefetch is not supported in FSDP2. Setting backward prefetch to None.",
                  "use_orig_params is obsolete in FSDP2", "sync_module_states is obsolete in FSDP2",
                  "use_orig_params from environment variable FSDP_USE_ORIG_PARAMS"):
        assert words in caplog.text, caplog.text
    # what `hasten launch` exported as a default stays quiet; what came from a config file is named
    monkeypatch.setenv("HASTEN_CONFIG_SOURCES", json.dumps({
        "fsdp_use_orig_params": ["default", "default"], "fsdp_sync_module_states": ["default", "default"],
        "fsdp_backward_prefetch": ["file", "cfg.yaml"]}))
    caplog.clear()
    with caplog.at_level("WARNING", logger="hasten.utils.dataclasses"):
        FullyShardedDataParallelPlugin()
    assert [r.getMessage().split(" (")[1] for r in caplog.records] == ["fsdp backward_prefetch from file cfg.yaml; FSDP1 only: remove it, or use fsdp_version=1)"]
    caplog.clear()
    with caplog.at_level("WARNING", logger="hasten.utils.dataclasses"):
        FullyShardedDataParallelPlugin(fsdp_version=2, backward_prefetch="BACKWARD_POST")
    assert "backward_prefetch is not supported in FSDP2" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="hasten.utils.dataclasses"):
        FullyShardedDataParallelPlugin(fsdp_version=2, sync_module_states=True)
    assert "sync_module_states is obsolete in FSDP2" in caplog.text and "FullyShardedDataParallelPlugin(...)" in caplog.text


def test_fsdp1_strategy_is_sharding_strategy_and_reshard_after_forward_stays_unset(monkeypatch):
    """As Accelerate: FSDP1 from FSDP_SHARDING_STRATEGY (or the default) fills sharding_strategy only."""
    from torch.distributed.fsdp import ShardingStrategy

    assert FullyShardedDataParallelPlugin().reshard_after_forward is None
    monkeypatch.setenv("FSDP_SHARDING_STRATEGY", "SHARD_GRAD_OP")
    plugin = FullyShardedDataParallelPlugin()
    assert (plugin.sharding_strategy, plugin.reshard_after_forward) == (ShardingStrategy.SHARD_GRAD_OP, None)
    monkeypatch.setenv("FSDP_SHARDING_STRATEGY", "3")
    assert FullyShardedDataParallelPlugin().sharding_strategy == ShardingStrategy.NO_SHARD
    given = FullyShardedDataParallelPlugin(reshard_after_forward="NO_SHARD")  # given: kept, and it is the strategy
    assert given.reshard_after_forward == given.sharding_strategy == ShardingStrategy.NO_SHARD


def test_the_names_accelerates_tests_patch_are_the_code_prepare_runs():
    """Accelerate's FSDP2 tests patch Accelerator._prepare_fsdp2 / _get_named_parameters, the accelerator module's
    fsdp2_prepare_model / fsdp2_canonicalize_names and utils.fsdp_utils' is_compiled_module /
    fsdp2_prepare_auto_wrap_policy: each exists and a patch of it changes what prepare() does (2 processes)."""
    result = launch("fsdp2_patched_names.py", timeout=300)
    assert result.stdout.count("fsdp2 patched names ok rank") == 2, result.stdout + result.stderr


def test_fsdp2_prepare_model_works_for_an_accelerate_shaped_accelerator():
    """fsdp2_prepare_model with something that only has Accelerate's attributes (no hasten backend) shards the
    model itself: torch's fully_shard per unit the (patchable) policy picks, and fp32 master weights under mixed
    precision unless the model holds 4-bit parameters, as Accelerate does."""
    from types import SimpleNamespace
    from unittest import mock

    from hasten.utils import fsdp_utils

    def stand_in(mixed_precision):
        plugin = SimpleNamespace(reshard_after_forward=True, cpu_offload=None, mixed_precision_policy=None,
                                 ignored_modules=None, cpu_ram_efficient_loading=False)
        return SimpleNamespace(state=SimpleNamespace(fsdp_plugin=plugin), mixed_precision=mixed_precision,
                               torch_device_mesh=None, device=torch.device("cpu"), is_main_process=True)

    for mixed_precision, four_bit, expected in (("bf16", False, {torch.float32}), ("no", False, {torch.bfloat16, torch.float32}),
                                                ("bf16", True, {torch.bfloat16, torch.float32})):
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
        model[0].to(torch.bfloat16)
        if four_bit:
            model[0].weight.__class__ = type("Params4bit", (torch.nn.Parameter,), {})
        with mock.patch("torch.distributed.fsdp.fully_shard") as fully_shard, \
                mock.patch.object(fsdp_utils, "fsdp2_prepare_auto_wrap_policy",
                                  return_value=lambda m: isinstance(m, torch.nn.Linear)):
            assert fsdp_utils.fsdp2_prepare_model(stand_in(mixed_precision), model) is model
        assert [call.args[0] for call in fully_shard.call_args_list] == [model[0], model]
        assert {p.dtype for p in model.parameters()} == expected, (mixed_precision, four_bit)


def test_checks_accelerate_does_not_make_warn_and_refuse_only_under_strict(monkeypatch, caplog):
    """FSDP2 drops param_init_fn and limit_all_gathers=False, an FSDP1 config's sharding strategy beside fsdp_version
    2, and FSDP1 turns sync_module_states on for cpu_ram_efficient_loading: Accelerate accepts each (warning in its
    words where it warns); hasten too, with a warning, and refuses them under its strict setting."""
    import json

    for kwargs, words in (({"param_init_fn": lambda module: None}, "param_init_fn is an FSDP1 setting"),
                          ({"limit_all_gathers": False}, "limit_all_gathers=False is an FSDP1 setting")):
        with pytest.warns(UserWarning, match=words):
            FullyShardedDataParallelPlugin(fsdp_version=2, **kwargs)
    with pytest.warns(UserWarning, match="sync_module_states cannot be False since efficient cpu ram loading enabled. "
                                         "Setting sync_module_states to True."):
        assert FullyShardedDataParallelPlugin(cpu_ram_efficient_loading=True, sync_module_states=False).sync_module_states
    monkeypatch.setenv("FSDP_SHARDING_STRATEGY", "SHARD_GRAD_OP")
    monkeypatch.setenv("HASTEN_CONFIG_SOURCES", json.dumps({"fsdp_sharding_strategy": ["file", "cfg.yaml"]}))
    with caplog.at_level("WARNING", logger="hasten.utils.dataclasses"):
        assert FullyShardedDataParallelPlugin(fsdp_version=2).reshard_after_forward is True
    assert "fsdp sharding_strategy from file cfg.yaml" in caplog.text
    monkeypatch.setenv("HASTEN_STRICT", "1")
    with pytest.raises(ConfigError, match="sharding_strategy .from file cfg.yaml. is an FSDP1 setting.*strict"):
        FullyShardedDataParallelPlugin(fsdp_version=2)
    monkeypatch.delenv("FSDP_SHARDING_STRATEGY")
    for kwargs, words in (({"fsdp_version": 2, "param_init_fn": lambda module: None}, "param_init_fn is an FSDP1"),
                          ({"fsdp_version": 2, "limit_all_gathers": False}, "limit_all_gathers=False is an FSDP1"),
                          ({"cpu_ram_efficient_loading": True, "sync_module_states": False}, "would keep empty")):
        with pytest.raises(ConfigError, match=words):
            FullyShardedDataParallelPlugin(**kwargs)


def test_config_file_fsdp_combinations_load_and_are_refused_under_strict(tmp_path, monkeypatch):
    from hasten.config.file import ConfigFileError, load_config_file

    texts = ("distributed_type: FSDP\nfsdp_config:\n  fsdp_cpu_ram_efficient_loading: true\n"
             "  fsdp_sync_module_states: false\n",
             "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n  fsdp_sharding_strategy: FULL_SHARD\n")
    for i, text in enumerate(texts):
        path = tmp_path / f"c{i}.yaml"
        path.write_text(text)
        assert load_config_file(str(path))["distributed_type"] == "FSDP"  # read as Accelerate reads it
        (tmp_path / f"s{i}.yaml").write_text(text + "strict: true\n")
        with pytest.raises(ConfigFileError, match="strict"):
            load_config_file(str(tmp_path / f"s{i}.yaml"))


def test_streaming_rank0_weights_into_a_mixed_device_model_keeps_its_parameters():
    """Issue 30, item 7: under FSDP2 CPU offload the parameter shards live in CPU memory and the buffers on the
    GPU, where torch's broadcast_from_rank0 loading refused two devices ("Multiple devices found"); that refusal
    shows on a GPU only (tests/gpu: the offload case). Here the meta device stands in for the GPU: the loading
    takes a model whose tensors live on two devices, fills every parameter and keeps every parameter object."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from hasten.backends.fsdp.sharding import load_full_state_dict, materialize
    from hasten.distributed.bootstrap import init_single_process_group

    if not dist.is_initialized():
        init_single_process_group()
    torch.manual_seed(0)
    source = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))
    fully_shard(model)
    materialize(model, torch.device("meta"), offload=True)  # parameters on CPU, buffers on the "GPU"
    before = {name: id(p) for name, p in model.named_parameters()}
    load_full_state_dict(model, source.state_dict(), torch.device("meta"), cpu_offload=True)
    assert {name: id(p) for name, p in model.named_parameters()} == before
    for name, param in model.named_parameters():
        assert torch.equal(param.to_local(), source.state_dict()[name]), name


def test_streaming_rank0_weights_walks_the_model_once(monkeypatch):
    """The streaming was quadratic: one torch state-dict walk of the whole model per tensor."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    import hasten.backends.fsdp.backend as backend
    from hasten.distributed.bootstrap import init_single_process_group

    if not dist.is_initialized():
        init_single_process_group()
    source = torch.nn.Sequential(*(torch.nn.Linear(3, 3) for _ in range(8)))
    model = torch.nn.Sequential(*(torch.nn.Linear(3, 3) for _ in range(8)))
    fully_shard(model)
    walks = []
    real = backend._named_tensors
    monkeypatch.setattr(backend, "_named_tensors", lambda m: walks.append(1) or real(m))
    import torch.distributed.checkpoint.state_dict as dsd

    monkeypatch.setattr(dsd, "set_model_state_dict", lambda *a, **k: walks.append(1))
    backend._stream_weights_from_rank0(model, dict(source.state_dict()))
    assert len(walks) == 1
    assert all(torch.equal(p.to_local(), source.state_dict()[n]) for n, p in model.named_parameters())


class _TiedLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(16, 8)
        self.block = torch.nn.Linear(8, 8)
        self.head = torch.nn.Linear(8, 16, bias=False)
        self.head.weight = self.embed.weight  # tied, as GPT-2's and most language models' output heads are

    def forward(self, ids):
        return self.head(self.block(self.embed(ids)))


def test_ram_efficient_loading_keeps_tied_weights_tied_and_filled():
    """`hasten launch --use_fsdp` turns cpu_ram_efficient_loading on (as Accelerate's launcher does). Sharding a
    meta copy and materialising it gave the output head its own uninitialised tensor, which rank 0's weights never
    reached: a tied language model trained (and saved, and loaded adapters into) a head of garbage until its
    first forward re-pointed it. The head must be the embedding's parameter, filled with rank 0's values."""
    import torch.distributed as dist

    from hasten import Accelerator
    from hasten.config.fsdp import FullyShardedDataParallelPlugin

    made_group = not dist.is_initialized()
    try:
        torch.manual_seed(0)
        model = _TiedLM()
        expected = model.embed.weight.detach().clone()
        plugin = FullyShardedDataParallelPlugin(fsdp_version=2, cpu_ram_efficient_loading=True)
        model = Accelerator(fsdp_plugin=plugin).prepare(model)
        assert model.head.weight is model.embed.weight
        assert torch.equal(model.head.weight.full_tensor(), expected)
        assert len(list(model.parameters())) == 3  # embedding (= head), block weight and bias
    finally:
        if made_group and dist.is_initialized():
            dist.destroy_process_group()


@pytest.mark.parametrize("weights", ["untied", "tied"])
def test_save_pretrained_after_fsdp2_training_writes_the_trained_weights(tmp_path, weights):
    """Accelerate's nd_parallel.py --dp-shard-size 2, shrunk (tests/workers/fsdp_save_pretrained.py): after FSDP2
    training, `model.save_pretrained(dir)` on every process wrote the trained whole weights (it crashed in
    safetensors on the DTensor shards: "invalid python storage"; with tied embeddings the other rank hung in
    transformers' tied-weight check), and so does `unwrap_model(model).save_pretrained(dir, state_dict=
    accelerator.get_state_dict(model))`; both reload with from_pretrained."""
    result = launch("fsdp_save_pretrained.py", tmp_path, weights, timeout=300)
    for route in ("plain", "explicit"):
        assert result.stdout.count(f"ok {route} rank") == 2, result.stdout + result.stderr
