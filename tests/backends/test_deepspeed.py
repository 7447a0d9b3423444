"""DeepSpeed: the plugin and config resolution (unit tests, no engine) and training, checkpoints and several
plugins in real processes (2 processes, gloo, CPU) through `hasten launch`.

DeepSpeed JIT-compiles its shared-memory collective (`deepspeed_shm_comm`, ~80 s on 2 cores) the first time a
process group starts; torch caches it in ~/.cache/torch_extensions, so the launched tests pay it once per
machine. Optimizers that need further JIT builds run only in the `slow` group.
"""

import base64
import json
import os
import subprocess
import sys

import pytest
import torch

from hasten.backends.deepspeed.dummies import DummyOptim, DummyScheduler
from hasten.config.deepspeed import DeepSpeedPlugin, HfDeepSpeedConfig
from hasten.core.errors import ConfigError, NotBuiltError, NotSupportedYetError

needs_deepspeed = pytest.mark.skipif(
    __import__("importlib").util.find_spec("deepspeed") is None, reason='needs deepspeed: pip install "hasten[deepspeed]"'
)


CONFIG = {"train_micro_batch_size_per_gpu": 4, "gradient_clipping": 1.0, "zero_optimization": {"stage": 3}}
CONFIG2 = {**CONFIG, "zero_optimization": {"stage": 2}}


# -- the plugin without a DeepSpeed config ---------------------------------------------------------------------
def test_plugin_defaults_match_accelerate():
    plugin = DeepSpeedPlugin(zero_stage=3)
    config = plugin.deepspeed_config
    assert config["gradient_accumulation_steps"] == "auto" and config["gradient_clipping"] == "auto"
    assert config["train_batch_size"] == "auto" and config["train_micro_batch_size_per_gpu"] == "auto"
    assert config["zero_optimization"]["stage"] == 3 and config["steps_per_print"] == float("inf")
    assert plugin.zero3_init_flag is True and plugin.is_zero3_init_enabled()
    default = DeepSpeedPlugin()
    assert default.zero_stage == 2 and default.zero3_init_flag is False
    assert default.deepspeed_config["zero_optimization"]["offload_optimizer"] == {"device": "none"}


def test_plugin_reads_launcher_variables(monkeypatch):
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "1")
    monkeypatch.setenv("HASTEN_GRADIENT_CLIPPING", "0.5")
    monkeypatch.setenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "4")
    plugin = DeepSpeedPlugin()
    assert (plugin.zero_stage, plugin.gradient_clipping, plugin.gradient_accumulation_steps) == (1, 0.5, 4)
    assert plugin.deepspeed_config["gradient_clipping"] == 0.5
    assert DeepSpeedPlugin(zero_stage=3).zero_stage == 3  # an argument beats the variable


def test_the_launchers_config_file_variable_is_the_plugins_config(monkeypatch, tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({**CONFIG2, "train_micro_batch_size_per_gpu": 3}))
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_CONFIG_FILE", str(path))  # as `--deepspeed_config_file` exports it
    assert DeepSpeedPlugin().deepspeed_config["train_micro_batch_size_per_gpu"] == 3


@pytest.mark.parametrize("field, value, message", [
    ("zero_stage", 4, "0, 1, 2 or 3"),
    ("zero_stage", "zero2", "0, 1, 2 or 3"),
    ("offload_optimizer_device", "gpu", "none, cpu, nvme"),
    ("gradient_accumulation_steps", 0, "integer >= 1"),
    ("gradient_clipping", "lots", "number >= 0"),
])
def test_bad_plugin_values_load_as_in_accelerate_and_are_refused_where_used(monkeypatch, field, value, message):
    """Accelerate stores a field as given (its own tests pass zero_stage="zero2"); hasten too, and refuses the value
    in one line where DeepSpeed would start (check_usable, which prepare calls), or at once under strict."""
    plugin = DeepSpeedPlugin(**{field: value})
    assert getattr(plugin, field) == value
    with pytest.raises(ConfigError, match=message) as info:
        plugin.check_usable()
    assert "\n" not in str(info.value) and field in str(info.value)
    monkeypatch.setenv("HASTEN_STRICT", "1")
    with pytest.raises(ConfigError, match=message):
        DeepSpeedPlugin(**{field: value})


def test_bad_plugin_values_from_a_variable_are_refused_at_once(monkeypatch):
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "zero2")  # Accelerate's int() fails on it too
    with pytest.raises(ConfigError, match="ACCELERATE_DEEPSPEED_ZERO_STAGE"):
        DeepSpeedPlugin()


def test_zero3_init_flag_on_another_stage_is_turned_off_as_in_accelerate(monkeypatch):
    with pytest.warns(UserWarning, match="DeepSpeed Zero3 Init flag is only applicable for ZeRO Stage 3. Setting it "
                                         "to False."):
        plugin = DeepSpeedPlugin(zero_stage=2, zero3_init_flag=True)
    assert plugin.zero3_init_flag is False and not plugin.is_zero3_init_enabled()
    with pytest.warns(UserWarning, match="only applicable for ZeRO Stage 3"):
        assert DeepSpeedPlugin(hf_ds_config=CONFIG2, zero3_init_flag=True).zero3_init_flag is False
    monkeypatch.setenv("HASTEN_STRICT", "1")
    with pytest.raises(ConfigError, match="only applies to stage 3.*strict") as info:
        DeepSpeedPlugin(zero_stage=2, zero3_init_flag=True)
    assert "\n" not in str(info.value)


def test_msamp_is_not_built():
    with pytest.raises(NotSupportedYetError, match="MS-AMP"):
        DeepSpeedPlugin(enable_msamp=True)


def test_fields_an_accelerate_config_file_sets_beside_a_deepspeed_config_file_are_refused(monkeypatch):
    """Accelerate's launcher lists the deepspeed_config keys of its config file in ACCELERATE_CONFIG_DS_FIELDS; with a
    DeepSpeed config file those would be silently overridden, so the plugin refuses them in Accelerate's words."""
    monkeypatch.setenv("ACCELERATE_CONFIG_DS_FIELDS", "zero3_init_flag,zero_stage")
    with pytest.raises(ConfigError, match="remove others config variables mentioned in the above specified list"):
        DeepSpeedPlugin(hf_ds_config=CONFIG)
    assert DeepSpeedPlugin(zero_stage=1).zero_stage == 1  # without a DeepSpeed config file the fields are the config
    monkeypatch.setenv("ACCELERATE_CONFIG_DS_FIELDS", "zero3_init_flag,deepspeed_moe_layer_cls_names")
    assert DeepSpeedPlugin(hf_ds_config=CONFIG).zero_stage == 3  # fields the DeepSpeed config has no key for




# -- with a DeepSpeed config -----------------------------------------------------------------------------------
def test_config_as_dict_path_json_and_base64(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(CONFIG))
    encoded = base64.urlsafe_b64encode(json.dumps(CONFIG).encode()).decode()
    for source in (CONFIG, str(path), path, json.dumps(CONFIG), encoded, HfDeepSpeedConfig(CONFIG)):
        plugin = DeepSpeedPlugin(hf_ds_config=source)
        assert plugin.zero_stage == 3 and plugin.gradient_clipping == 1.0 and plugin.hf_ds_config.is_zero3()
    assert CONFIG == {"train_micro_batch_size_per_gpu": 4, "gradient_clipping": 1.0, "zero_optimization": {"stage": 3}}
    with pytest.raises(ConfigError, match="zero_optimization"):
        DeepSpeedPlugin(hf_ds_config={"train_batch_size": 8})
    with pytest.raises(ConfigError, match="neither an existing file nor JSON"):
        DeepSpeedPlugin(hf_ds_config=str(tmp_path / "missing.json"))


def test_config_lookups():
    config = HfDeepSpeedConfig({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
                                "bf16": {"enabled": "true"}})
    assert config.is_zero2() and not config.is_zero3() and config.is_offload()
    assert config.get_value("zero_optimization.offload_optimizer.device") == "cpu"
    assert config.get_value("zero_optimization.nope.device", "x") == "x"
    assert config.is_true("bf16.enabled") and not config.is_false("bf16.enabled")
    config.del_config_sub_tree("zero_optimization.offload_optimizer")
    assert config.get_value("zero_optimization.offload_optimizer") is None
    with pytest.raises(ConfigError):
        config.del_config_sub_tree("zero_optimization.offload_optimizer", must_exist=True)


def test_plugin_fields_fill_auto_and_missing_entries():
    plugin = DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": "auto"}}, zero_stage=1, gradient_clipping=0.3)
    assert plugin.deepspeed_config["zero_optimization"]["stage"] == 1 and plugin.zero_stage == 1
    # Accelerate drops a plugin value whose key the config lacks; hasten writes it in.
    assert plugin.deepspeed_config["gradient_clipping"] == 0.3
    # A config without gradient_accumulation_steps trains with 1, as in Accelerate.
    assert plugin.deepspeed_config["gradient_accumulation_steps"] == 1


def test_a_value_given_twice_differently_names_both_sources(tmp_path, monkeypatch):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(CONFIG))
    with pytest.raises(ConfigError) as info:
        DeepSpeedPlugin(hf_ds_config=str(path), zero_stage=2)
    message = str(info.value)
    assert "zero_optimization.stage" in message and str(path) in message and "DeepSpeedPlugin(zero_stage=2)" in message
    monkeypatch.setenv("ACCELERATE_GRADIENT_CLIPPING", "0.5")
    with pytest.raises(ConfigError, match="ACCELERATE_GRADIENT_CLIPPING"):
        DeepSpeedPlugin(hf_ds_config=CONFIG)
    monkeypatch.delenv("ACCELERATE_GRADIENT_CLIPPING")
    assert DeepSpeedPlugin(hf_ds_config=CONFIG, zero_stage=3).zero_stage == 3  # the same value twice is fine


def test_mixed_precision_against_the_config():
    plugin = DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 2}, "bf16": {"enabled": True}})
    plugin.set_mixed_precision("no")  # the config's bf16 stands (as in Accelerate)
    assert plugin.mixed_precision == "bf16"
    with pytest.raises(ConfigError, match="bf16.enabled"):
        plugin.set_mixed_precision("fp16")
    auto = DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 2}, "bf16": {"enabled": "auto"}})
    auto.set_mixed_precision("bf16")
    assert auto.deepspeed_config["bf16"] == {"enabled": True} and auto.deepspeed_config["fp16"]["enabled"] is False


def test_dummy_optimizer_and_scheduler_are_recognised_by_prepare():
    model = torch.nn.Linear(2, 2)
    optimizer = DummyOptim(model.parameters(), lr=0.1, weight_decay=0.01)
    assert isinstance(optimizer, torch.optim.Optimizer) and optimizer.lr == 0.1
    scheduler = DummyScheduler(optimizer, total_num_steps=10, warmup_num_steps=2)
    assert scheduler.get_last_lr() == [0.1]
    with pytest.raises(ConfigError, match="prepare"):
        optimizer.step()


# -- the Accelerator with DeepSpeed (one process, no engine yet) ------------------------------------------------
# ZeRO-2 here: with ZeRO-3 and transformers installed, Accelerator() already starts DeepSpeed's communication
# (for zero3_init), which belongs in a launched process, not in the test runner's.
@needs_deepspeed
def test_accelerator_accumulation_steps_agree_with_the_config(monkeypatch, caplog):
    from hasten import Accelerator
    from hasten.state import AcceleratorState

    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config={**CONFIG2, "gradient_accumulation_steps": 4}))
    assert accelerator.gradient_accumulation_steps == 4  # the config's value, the Accelerator gave none
    assert accelerator.distributed_type == "DEEPSPEED" and accelerator.deepspeed_plugin.selected
    AcceleratorState._reset_state(True)
    # Two numbers: as Accelerate, a warning in its words (on its logger) and the DeepSpeed config's value
    with caplog.at_level("WARNING", logger="hasten.accelerator"):
        accelerator = Accelerator(gradient_accumulation_steps=2, deepspeed_plugin=DeepSpeedPlugin(
            hf_ds_config={**CONFIG2, "gradient_accumulation_steps": 4}))
    assert accelerator.gradient_accumulation_steps == 4
    assert "Gradient accumulation steps mismatch: GradientAccumulationPlugin has 2, DeepSpeed config has 4. Using " \
           "DeepSpeed's value." in caplog.text
    AcceleratorState._reset_state(True)
    monkeypatch.setenv("HASTEN_STRICT", "1")
    with pytest.raises(ConfigError) as info:
        Accelerator(gradient_accumulation_steps=2,
                    deepspeed_plugin=DeepSpeedPlugin(hf_ds_config={**CONFIG2, "gradient_accumulation_steps": 4}))
    assert "Accelerator(gradient_accumulation_steps=...)" in str(info.value) and "4" in str(info.value)


@needs_deepspeed
def test_a_gpu_configuration_loads_on_a_cpu_and_is_refused_at_prepare(monkeypatch):
    """fp16 and CPU offload are GPU settings: the Accelerator is built (its config can be read and tested on a
    laptop, as with Accelerate), and prepare() refuses fp16 in one line before DeepSpeed starts; CPU offload is a
    no-op on a CPU run (tests/workers/deepspeed_cpu_offload.py), refused only under hasten's strict setting."""
    from torch.utils.data import DataLoader

    from hasten import Accelerator
    from hasten.state import AcceleratorState

    cases = [(dict(mixed_precision="fp16", deepspeed_plugin=DeepSpeedPlugin()), "fp16 on a CPU.*bf16"),
             (dict(deepspeed_plugin=DeepSpeedPlugin(offload_optimizer_device="cpu")), "already trains on the CPU.*strict"),
             (dict(deepspeed_plugin=DeepSpeedPlugin(zero_stage="zero2")), "zero_stage='zero2'.*0, 1, 2 or 3")]
    for kwargs, message in cases:
        monkeypatch.setenv("HASTEN_STRICT", "1" if "strict" in message else "0")
        AcceleratorState._reset_state(True)
        accelerator = Accelerator(**kwargs)
        assert accelerator.distributed_type == "DEEPSPEED"
        model = torch.nn.Linear(2, 2)
        loader = DataLoader(torch.randn(8, 2), batch_size=4)
        with pytest.raises(ConfigError, match=message) as info:
            accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), loader)
        assert "\n" not in str(info.value)
    assert accelerator.deepspeed_plugin.deepspeed_config["fp16"]["enabled"] is False
    AcceleratorState._reset_state(True)
    assert Accelerator(mixed_precision="fp16", deepspeed_plugin=DeepSpeedPlugin()).deepspeed_config["fp16"]["enabled"]


@needs_deepspeed
def test_plugins_for_a_second_accelerator_are_refused_as_in_accelerate():
    from hasten import Accelerator
    from hasten.state import AcceleratorState

    AcceleratorState._reset_state(True)
    with pytest.raises(ConfigError, match="not both"):
        Accelerator(deepspeed_plugin=DeepSpeedPlugin(), deepspeed_plugins={"a": DeepSpeedPlugin()})
    AcceleratorState._reset_state(True)
    Accelerator(deepspeed_plugin=DeepSpeedPlugin())
    with pytest.raises(NotImplementedError, match="when creating a second `Accelerator`"):
        Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=1))
    AcceleratorState._reset_state(True)


@needs_deepspeed
@pytest.mark.parametrize("optimizer, message", [
    ({"type": "AdamW", "params": {"lr": 0.1}}, "compiled on first use.*torch_adam"),
    ({"type": "Lamb", "params": {"lr": 0.1}}, "no CPU implementation.*torch_adam"),
])
def test_jit_only_optimizers_are_refused_on_cpu_before_deepspeed_runs(monkeypatch, optimizer, message):
    from hasten import Accelerator
    from hasten.backends.deepspeed import backend

    monkeypatch.setattr(backend, "_op_is_built", lambda op: False)  # as on a machine that never compiled it
    config = {**CONFIG2, "optimizer": optimizer}
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=config))
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ConfigError, match=message) as info:
        accelerator.prepare(model, DummyOptim(model.parameters()))
    assert "\n" not in str(info.value)


@needs_deepspeed
def test_allow_jit_lets_the_compiled_optimizer_through_to_deepspeed(monkeypatch):
    """HASTEN_DEEPSPEED_ALLOW_JIT=1 lifts the refusal above: prepare goes on to deepspeed.initialize (stopped there:
    compiling the op takes minutes; tests/workers/deepspeed_jit.py trains with it)."""
    import deepspeed

    from hasten import Accelerator
    from hasten.backends.deepspeed import backend

    class Reached(Exception):
        pass

    def initialize(**kwargs):
        raise Reached

    monkeypatch.setattr(backend, "_op_is_built", lambda op: False)
    monkeypatch.setattr(deepspeed, "initialize", initialize)
    monkeypatch.setenv("HASTEN_DEEPSPEED_ALLOW_JIT", "1")
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config={
        **CONFIG2, "optimizer": {"type": "AdamW", "params": {"lr": 0.1}}}))
    model = torch.nn.Linear(2, 2)
    with pytest.raises(Reached):
        accelerator.prepare(model, DummyOptim(model.parameters()))


@needs_deepspeed
def test_prepare_rule_errors_come_before_deepspeed():
    from hasten import Accelerator
    from hasten.state import AcceleratorState

    model = torch.nn.Linear(2, 2)
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin())
    with pytest.raises(ConfigError, match="micro-batch size"):
        accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    AcceleratorState._reset_state(True)
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config={
        **CONFIG2, "optimizer": {"type": "AdamW", "params": {"lr": 0.1, "torch_adam": True}}}))
    with pytest.raises(ConfigError, match="optimizer.*section"):
        accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    AcceleratorState._reset_state(True)
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=CONFIG2))
    with pytest.raises(ConfigError, match="DummyOptim needs"):
        accelerator.prepare(model, DummyOptim(model.parameters()))
    AcceleratorState._reset_state(True)
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=CONFIG2))
    loader = torch.utils.data.DataLoader(list(range(8)), batch_size=2)
    with pytest.raises(ConfigError, match=r"train_micro_batch_size_per_gpu is 4 in .* but 2 in the DataLoader's batch_size"):
        accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), loader)


@needs_deepspeed
def test_the_backend_keeps_the_plans_fp8_recipe_and_leaves_casting_to_the_engine():
    """DeepSpeed's engine casts and scales losses from its config, so the backend turns hasten's autocast and loss
    scaler off; the rest of the precision policy built from the run plan (the fp8 recipe, with the plan's engine)
    stays the run's. The backend used to build a fresh policy of its own, which dropped the recipe."""
    from types import SimpleNamespace

    from hasten.backends.deepspeed.backend import DeepSpeedBackend
    from hasten.core.enums import DistributedType
    from hasten.plan import Cluster, make_run_plan
    from hasten.training.precision import PrecisionPolicy

    plan = make_run_plan(cluster=lambda _fsdp: Cluster(1, "cpu", DistributedType.NO), mixed_precision="bf16",
                         deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=CONFIG2))
    recipe = object()  # stands for the run's Fp8Recipe
    policy = PrecisionPolicy(mode="bf16", device_type="cpu", autocast_kwargs={"cache_enabled": False}, fp8=recipe)
    backend = DeepSpeedBackend(SimpleNamespace(device=torch.device("cpu")), plan, precision=policy)
    assert backend.precision.fp8 is recipe and backend.precision.device_type == "cpu"
    assert not backend.precision.native_amp and backend.make_grad_scaler() is None
    assert backend.precision.autocast_kwargs == {} and policy.mode == "bf16"  # the Accelerator's policy is untouched


@needs_deepspeed
def test_autotp_in_a_deepspeed_config_is_refused_before_deepspeed_runs():
    """docs/deepspeed.md: AutoTP is not built; its config key is refused in one line, not handed to DeepSpeed."""
    from hasten import Accelerator
    from hasten.state import AcceleratorState

    model = torch.nn.Linear(2, 2)
    loader = torch.utils.data.DataLoader(list(range(8)), batch_size=4)
    for size, refused in ((2, True), (1, False)):
        AcceleratorState._reset_state(True)
        accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config={
            **CONFIG2, "tensor_parallel": {"autotp_size": size}}))
        if refused:
            with pytest.raises(NotBuiltError, match="tensor_parallel.autotp_size=2") as info:
                accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), loader)
            assert "\n" not in str(info.value)
        else:
            from hasten.backends.deepspeed import backend

            assert backend.refuse_autotp(accelerator.deepspeed_plugin.deepspeed_config) is None
    AcceleratorState._reset_state(True)


def test_import_paths_and_no_deepspeed_import():
    code = (
        "import sys, hasten, hasten.utils, hasten.utils.deepspeed as d, hasten.utils.dataclasses as dc\n"
        "assert hasten.DeepSpeedPlugin is hasten.utils.DeepSpeedPlugin is d.DeepSpeedPlugin is dc.DeepSpeedPlugin\n"
        "for name in ('HfDeepSpeedConfig', 'DummyOptim', 'DummyScheduler', 'DeepSpeedEngineWrapper',\n"
        "             'DeepSpeedOptimizerWrapper', 'DeepSpeedSchedulerWrapper', 'get_active_deepspeed_plugin'):\n"
        "    assert getattr(hasten.utils, name) is getattr(d, name), name\n"
        "assert callable(d.map_pytorch_optim_to_deepspeed)\n"
        "hasten.DeepSpeedPlugin(zero_stage=3)\n"
        "assert 'deepspeed' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# -- real processes --------------------------------------------------------------------------------------------
@needs_deepspeed
def test_training_matches_ddp_and_resolves_auto_values(tmp_path):
    """ZeRO 1/2/3 in fp32 (max |difference| < 1e-5) and bf16 (< 3e-2) against the plain reference; accumulation;
    "auto" values; ZeRO-3 save_model; two models with two plugins — one launch, several checks."""
    from launching import launch

    result = launch("deepspeed_train.py", tmp_path, timeout=600)
    for check in ("matches_ddp", "zero3_save_model", "accumulation", "auto_config", "two_plugins", "zero3_init"):
        assert f"OK {check}" in result.stdout, result.stdout[-3000:]


@needs_deepspeed
def test_cpu_offload_on_a_cpu_run_warns_once_and_trains(tmp_path):
    """The configs of Accelerate's test_ds_multiple_model.py on a CPU run: ZeRO-2 with offload_optimizer 'cpu' and
    ZeRO-3 with offload_optimizer and offload_param 'cpu', two models, two processes. Each prepare warns once
    (the offload is a no-op: DeepSpeed gets the config without it, the plugin keeps it) and both engines train
    as the one-process reference (max |difference| < 1e-5); it was refused ("already trains on the CPU")."""
    from launching import launch

    result = launch("deepspeed_cpu_offload.py", timeout=600)
    for check in ("warned", "trains"):
        assert result.stdout.count(f"OK {check}") == 2, result.stdout[-3000:] + result.stderr[-3000:]


@needs_deepspeed
def test_resume_is_bit_identical_and_a_killed_save_leaves_the_previous_checkpoint(tmp_path):
    """Save at step 3 of 6 (ZeRO-2 fp32, ZeRO-3 bf16); a second run SIGKILLed inside its save_state; a third
    run loads the newest whole checkpoint (still checkpoint_0) and its steps 4-6 equal the first run's exactly."""
    from launching import launch

    launch("deepspeed_resume.py", tmp_path, "train", timeout=300)
    killed = launch("deepspeed_resume.py", tmp_path, "crash", check=False, timeout=300,
                    env={"HASTEN_TEST_CRASH_AT": "1", "HASTEN_TEST_CRASH_RANK": "0"})
    assert killed.returncode != 0 and "signal 9" in killed.stderr + killed.stdout
    result = launch("deepspeed_resume.py", tmp_path, "resume", timeout=300)
    assert "OK resume zero2_fp32" in result.stdout and "OK resume zero3_bf16" in result.stdout


@needs_deepspeed
@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("HASTEN_TEST_DEEPSPEED_JIT") != "1",
                    reason="compiles DeepSpeed's Adam op (4-10 min on 2 cores): opt in with HASTEN_TEST_DEEPSPEED_JIT=1")
def test_deepspeeds_own_adamw_compiles_when_allowed_and_trains_like_torch():
    """HASTEN_DEEPSPEED_ALLOW_JIT=1: DeepSpeed's AdamW (compiled on first use: ~10 minutes on a loaded 2-core
    machine, cached in ~/.cache/torch_extensions afterwards) matches torch's AdamW within 1e-4 after 4 steps."""
    from launching import launch

    result = launch("deepspeed_jit.py", env={"HASTEN_DEEPSPEED_ALLOW_JIT": "1"}, timeout=1800)
    assert "OK jit_adamw" in result.stdout


# -- launching --------------------------------------------------------------------------------------------------
def _plan(*argv):
    from hasten.commands.launch import launch_command_parser, plan_launch

    return plan_launch(launch_command_parser().parse_args([*argv, "train.py"]))


def test_launch_flags_become_the_plugins_variables(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    config = tmp_path / "ds.json"
    config.write_text(json.dumps(CONFIG))
    env = _plan("--num_processes", "2", "--use_deepspeed", "--zero_stage", "3", "--gradient_clipping", "1.0",
                "--deepspeed_config_file", str(config), "--zero3_init_flag", "false").settings.env
    assert env["HASTEN_USE_DEEPSPEED"] == "true" and env["HASTEN_DEEPSPEED_ZERO_STAGE"] == "3"
    assert env["HASTEN_DEEPSPEED_CONFIG_FILE"] == str(config) and env["HASTEN_GRADIENT_CLIPPING"] == "1.0"
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    plugin = DeepSpeedPlugin()  # what the script's Accelerator() builds from them
    assert (plugin.zero_stage, plugin.gradient_clipping, plugin.zero3_init_flag) == (3, 1.0, False)
    monkeypatch.setenv("HASTEN_GRADIENT_CLIPPING", "0.5")
    with pytest.raises(ConfigError, match=f"1.0 in DeepSpeed config {config} but 0.5 in "):
        DeepSpeedPlugin()
    with pytest.raises(ConfigError, match="DeepSpeed's own multi-node launchers .* --num_machines"):
        _plan("--use_deepspeed", "--deepspeed_hostfile", "hosts")


def test_hasten_config_asks_the_deepspeed_questions(tmp_path, monkeypatch):
    from hasten.commands.config import Questions, questionnaire
    from hasten.config import file as config_file

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    answers = iter([
        "DEEPSPEED", "", "2",   # DeepSpeed, 1 machine, 2 processes
        "", "3", "", "cpu",     # no JSON file; ZeRO-3; optimizer state kept; parameters offloaded to CPU
        "4", "0.5", "yes",      # accumulation, clipping, zero3_init_flag
        "no", "no", "bf16",     # no torch.compile, no debug, bf16
    ])
    config = questionnaire(Questions(read=lambda prompt: next(answers), write=lambda text: None),
                           {"device": "cpu", "device_count": 0, "cpu_cores": 2})
    assert config["distributed_type"] == "DEEPSPEED" and config["use_cpu"] is True
    assert config["deepspeed_config"] == {
        "zero_stage": 3, "offload_optimizer_device": "none", "offload_param_device": "cpu",
        "gradient_accumulation_steps": 4, "gradient_clipping": 0.5, "zero3_init_flag": True,
    }
    config_file.validate(config)
    path = tmp_path / "hf" / "hasten" / "default_config.yaml"
    path.parent.mkdir(parents=True)
    import yaml

    path.write_text(yaml.safe_dump(config))
    env = _plan().settings.env
    assert env["HASTEN_USE_DEEPSPEED"] == "true" and env["HASTEN_DEEPSPEED_OFFLOAD_PARAM_DEVICE"] == "cpu"
    assert env["HASTEN_GRADIENT_ACCUMULATION_STEPS"] == "4" and env["HASTEN_DEEPSPEED_ZERO3_INIT"] == "true"


@needs_deepspeed
def test_a_launched_script_gets_deepspeed_from_the_config_file_and_flags(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("distributed_type: DEEPSPEED\nnum_processes: 2\nmixed_precision: bf16\ndeepspeed_config:\n"
                      "  zero_stage: 1\n  gradient_accumulation_steps: 2\n")
    from launching import launch

    result = launch("deepspeed_launch.py", 1, 0.25, 2, flags=["--config_file", str(config), "--gradient_clipping", "0.25"])
    assert "OK launch rank 0 main=True" in result.stdout and "OK launch rank 1 main=False" in result.stdout


def test_unbuilt_deepspeed_names_import_and_refuse_in_one_line(monkeypatch):
    """Ulysses sequence parallelism and DeepSpeed's own multi-node launcher exist at Accelerate's paths (so
    imports work) and refuse when used, saying what to do instead. The Ulysses settings object is data, checked
    as Accelerate checks it; sp_size above 1 without DeepSpeed is refused (tests/distributed/test_sequence_parallel.py
    runs it with DeepSpeed)."""
    from hasten.parallelism_config import ParallelismConfig
    from hasten.plan.layout import backend_for_layout
    from hasten.utils import DeepSpeedSequenceParallelConfig, prepare_deepspeed_cmd_env
    from hasten.utils.dataclasses import (
        DeepSpeedSequenceParallelConfig as from_dataclasses,
    )
    from hasten.utils.launch import prepare_deepspeed_cmd_env as from_launch

    assert from_dataclasses is DeepSpeedSequenceParallelConfig and from_launch is prepare_deepspeed_cmd_env
    for name in ("SP_SEQ_LENGTH", "SP_SEQ_LENGTH_IS_VARIABLE", "SP_ATTN_IMPLEMENTATION"):
        monkeypatch.delenv(f"PARALLELISM_CONFIG_{name}", raising=False)
    handler = DeepSpeedSequenceParallelConfig(sp_seq_length=128)
    assert handler.sp_seq_length_is_variable is True and handler.sp_attn_implementation is None
    for bad in ("eager", "foobar", "someone/other-kernel"):
        with pytest.raises(ValueError, match=f"Invalid sp_attn_implementation: {bad}"):
            DeepSpeedSequenceParallelConfig(sp_attn_implementation=bad)
    assert DeepSpeedSequenceParallelConfig(sp_attn_implementation="kernels-community/flash-attn2")
    with pytest.raises(ValueError, match="sp_seq_length` must be provided"):
        DeepSpeedSequenceParallelConfig(sp_seq_length_is_variable=False)
    monkeypatch.setenv("PARALLELISM_CONFIG_SP_SEQ_LENGTH_IS_VARIABLE", "false")
    monkeypatch.setenv("PARALLELISM_CONFIG_SP_SEQ_LENGTH", "256")
    monkeypatch.setenv("PARALLELISM_CONFIG_SP_ATTN_IMPLEMENTATION", "sdpa")
    from_env = DeepSpeedSequenceParallelConfig()
    assert (from_env.sp_seq_length_is_variable, from_env.sp_seq_length, from_env.sp_attn_implementation) == (
        False, 256, "sdpa")
    config = ParallelismConfig(sp_backend="deepspeed", sp_size=2, sp_handler=handler)
    with pytest.raises(ConfigError, match="sp_backend='deepspeed' needs DeepSpeed") as refused:  # no plugin
        backend_for_layout(config, 2)
    assert "\n" not in str(refused.value)
    with pytest.raises(NotSupportedYetError, match="hasten launch --use_deepspeed") as refused:
        prepare_deepspeed_cmd_env(None)
    assert "\n" not in str(refused.value)


def test_deepspeed_optimizer_step_counts_for_preemption(monkeypatch):
    """The engine steps in backward; the script's optimizer.step() still advances the preemption counter."""
    from hasten.backends.deepspeed.wrappers import DeepSpeedOptimizerWrapper
    from hasten.resilience import preemption
    from hasten.state import GradientState

    counted = []
    monkeypatch.setattr(preemption, "_active", type("Handler", (), {"count_optimizer_step": lambda self: counted.append(1)})())
    wrapper = DeepSpeedOptimizerWrapper(torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1))
    GradientState()._set_sync_gradients(True)
    wrapper.step()
    GradientState()._set_sync_gradients(False)
    wrapper.step()  # an accumulation micro-step: no optimizer step
    assert counted == [1]


@needs_deepspeed
def test_plugin_fields_reach_the_deepspeed_config_and_engine_inputs(monkeypatch):
    """DeepSpeedPlugin fields shown where DeepSpeed reads them: offload devices and NVMe paths and
    zero3_save_16bit_model in the generated config; is_train_batch_min picks the smallest (True) or largest (False)
    batch size of the loaders given to prepare() as the micro-batch; transformer_moe_cls_names marks those blocks
    as ZeRO-3 leaves; dschf is transformers' view of the config while ZeRO-3 init is on; msamp_opt_level refused."""
    from hasten import Accelerator
    from hasten.state import AcceleratorState, GradientState

    plugin = DeepSpeedPlugin(zero_stage=3, offload_optimizer_device="nvme", offload_optimizer_nvme_path="/nvme/opt",
                             offload_param_device="nvme", offload_param_nvme_path="/nvme/param",
                             zero3_save_16bit_model=True)
    zero = plugin.deepspeed_config["zero_optimization"]
    assert zero["offload_optimizer"] == {"device": "nvme", "nvme_path": "/nvme/opt"}
    assert zero["offload_param"] == {"device": "nvme", "nvme_path": "/nvme/param"}
    assert zero["stage3_gather_16bit_weights_on_model_save"] is True
    assert DeepSpeedPlugin(zero_stage=3, offload_param_device="cpu").deepspeed_config["zero_optimization"][
        "offload_param"] == {"device": "cpu"}

    loaders = [torch.utils.data.DataLoader(list(range(16)), batch_size=size) for size in (2, 8)]
    for is_min, micro in ((True, 2), (False, 8)):
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
        acc = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2, is_train_batch_min=is_min))
        config = acc._backend._fill_config(acc.state.deepspeed_plugin, torch.nn.Linear(2, 2), None, None, loaders,
                                           False, 1)
        assert config["train_micro_batch_size_per_gpu"] == micro

    class Expert(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(2, 2)

    model = torch.nn.Sequential(Expert(), torch.nn.Linear(2, 2))
    DeepSpeedPlugin(zero_stage=3, transformer_moe_cls_names="Expert").set_moe_leaf_modules(model)
    from deepspeed.utils import z3_leaf_module

    assert z3_leaf_module(model[0]) and not z3_leaf_module(model[1])
    with pytest.raises(ConfigError, match="transformer_moe_cls_names lists Router"):
        DeepSpeedPlugin(zero_stage=3, transformer_moe_cls_names="Router").set_moe_leaf_modules(model)

    import transformers.integrations

    import hasten.config.deepspeed as ds_config

    class TransformersView:  # stands for transformers' HfDeepSpeedConfig, which needs the accelerate alias installed
        def __init__(self, config):
            self.config = config

    monkeypatch.setattr(ds_config, "_transformers_sees_accelerate", lambda: True)
    monkeypatch.setattr(transformers.integrations, "HfDeepSpeedConfig", TransformersView)
    plugin = DeepSpeedPlugin(zero_stage=3, zero3_init_flag=True)
    plugin.set_deepspeed_weakref()
    assert isinstance(plugin.dschf, TransformersView)
    assert plugin.dschf.config["zero_optimization"]["stage"] == 3
    assert plugin.dschf.config["train_micro_batch_size_per_gpu"] == 1  # "auto" made concrete for transformers
    with plugin.zero3_init_context_manager(enable=False):
        assert plugin.dschf is None
    assert plugin.dschf is not None

    with pytest.raises(NotSupportedYetError, match="msamp_opt_level"):
        DeepSpeedPlugin(msamp_opt_level="O2")
