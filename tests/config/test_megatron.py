"""Megatron-LM's surface served natively (config/megatron.py, utils/megatron_lm.py): each setting maps onto
hasten's TP/PP/FSDP or is refused in one line; a 4-process TP x PP run from a Megatron config file equals one
process (tests/workers/megatron_layouts.py)."""

from __future__ import annotations

import pytest
import torch

from hasten.commands.launch import launch_command_parser
from hasten.config.launch_settings import resolve_launch
from hasten.plan import megatron_layout
from hasten.config.megatron import MegatronLMPlugin
from hasten.core.errors import ConfigError, MegatronLMOnlyError, NotBuiltError
from hasten.utils import megatron_lm

from launching import launch


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    import os

    for name in list(os.environ):
        if name.startswith(("MEGATRON_LM_", "HASTEN_", "ACCELERATE_", "PARALLELISM_CONFIG_")):
            monkeypatch.delenv(name)


def test_defaults_are_accelerates():
    plugin = MegatronLMPlugin()
    assert (plugin.tp_degree, plugin.pp_degree, plugin.num_micro_batches, plugin.gradient_clipping) == (1, 1, 1, 1.0)
    assert not (plugin.recompute_activations or plugin.use_distributed_optimizer or plugin.sequence_parallelism)
    assert plugin.lr_decay_style == "linear" and plugin.eval_iters == 100


def test_parallel_fields_become_the_layout():
    layout = megatron_layout(MegatronLMPlugin(tp_degree=2, pp_degree=2, num_micro_batches=4), 8)
    assert (layout.tp_size, layout.pp_size, layout.dp_replicate_size, layout.dp_shard_size) == (2, 2, 2, 1)
    assert layout.pp_handler.microbatches == 4
    sharded = megatron_layout(MegatronLMPlugin(tp_degree=2, use_distributed_optimizer=True), 8)
    assert (sharded.tp_size, sharded.dp_shard_size, sharded.dp_replicate_size, sharded.pp_size) == (2, 4, 1, 1)
    with pytest.raises(ConfigError, match="does not divide the 6"):
        megatron_layout(MegatronLMPlugin(tp_degree=4), 6)


def test_fields_are_read_from_the_launchers_variables(monkeypatch):
    monkeypatch.setenv("MEGATRON_LM_TP_DEGREE", "2")
    monkeypatch.setenv("MEGATRON_LM_PP_DEGREE", "4")
    monkeypatch.setenv("MEGATRON_LM_NUM_MICRO_BATCHES", "8")
    monkeypatch.setenv("MEGATRON_LM_GRADIENT_CLIPPING", "0.25")
    monkeypatch.setenv("MEGATRON_LM_RECOMPUTE_ACTIVATIONS", "true")
    plugin = MegatronLMPlugin(pp_degree=2)  # code beats the variable
    assert (plugin.tp_degree, plugin.pp_degree, plugin.num_micro_batches) == (2, 2, 8)
    assert plugin.gradient_clipping == 0.25 and plugin.recompute_activations is True
    given = MegatronLMPlugin(gradient_clipping=2.0, recompute_activations=False)
    assert (given.gradient_clipping, given.recompute_activations) == (2.0, False)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"train_iters": 100}, MegatronLMOnlyError, "torch LR scheduler"),
        ({"lr_warmup_iters": 10}, MegatronLMOnlyError, "torch LR scheduler"),
        ({"custom_train_step_class": object}, MegatronLMOnlyError, "write the step in your loop"),
        ({"custom_model_provider_function": print}, MegatronLMOnlyError, "accelerator.prepare"),
        ({"megatron_dataset_flag": True}, MegatronLMOnlyError, "torch DataLoader"),
        ({"tensorboard_dir": "/tmp/tb"}, MegatronLMOnlyError, "log_with='tensorboard'"),
        ({"eod_mask_loss": True}, MegatronLMOnlyError, "set it in the model"),
        ({"other_megatron_args": {"swiglu": True}}, MegatronLMOnlyError, "other_megatron_args"),
        ({"num_layers_per_virtual_pipeline_stage": 2}, MegatronLMOnlyError, "Interleaved1F1B"),
        ({"context_parallel_size": 2}, MegatronLMOnlyError, "cp_size"),
        ({"sequence_parallelism": True}, NotBuiltError, "sequence_parallel"),
        ({"num_micro_batches": 4}, ConfigError, "gradient_accumulation_steps=4"),
        ({"recompute_activations": True}, ConfigError, "fsdp_activation_checkpointing"),
        ({"tp_degree": 0}, ConfigError, "whole number of 1 or more"),
    ],
)
def test_megatron_only_and_impossible_fields_are_refused_in_one_line(kwargs, error, message):
    with pytest.raises(error, match=message) as caught:
        MegatronLMPlugin(**kwargs)
    assert "\n" not in str(caught.value)


def test_megatron_only_objects_refuse_on_use_in_one_line():
    from hasten.utils.dataclasses import MODEL_CONFIGS_TO_MEGATRON_PARSERS

    uses = [
        lambda: megatron_lm.GPTTrainStep(None, None), lambda: megatron_lm.BertTrainStep(None, None),
        lambda: megatron_lm.T5TrainStep(None, None), lambda: megatron_lm.MegatronEngine(None, None, None, None),
        lambda: megatron_lm.MegatronLMDummyDataLoader(data_path="x"),
        lambda: megatron_lm.MegatronLMDummyScheduler(None, total_num_steps=10),
        lambda: megatron_lm.MegatronLMOptimizerWrapper(None), lambda: megatron_lm.MegatronLMSchedulerWrapper(None, []),
        lambda: megatron_lm.initialize(None), lambda: megatron_lm.prepare_data_loader(None, None),
        lambda: megatron_lm.prepare_model_optimizer_scheduler(None), lambda: megatron_lm.prepare_optimizer(None, None),
        lambda: megatron_lm.prepare_scheduler(None, None, None),
        lambda: MegatronLMPlugin().set_optimizer_type(None),
        lambda: megatron_lm.finish_mpu_init(), lambda: megatron_lm.model_provider_func(),
        *[lambda parse=parse: parse(None, None, None) for parse in MODEL_CONFIGS_TO_MEGATRON_PARSERS.values()],
    ]
    from hasten.utils import add_model_config_to_megatron_parser

    uses.append(lambda: add_model_config_to_megatron_parser("gpt2"))
    for use in uses:
        with pytest.raises(MegatronLMOnlyError, match="exists only inside the Megatron-LM library.*fix: ") as caught:
            use()
        assert "\n" not in str(caught.value)


def test_data_parallel_helpers_outside_a_distributed_run():
    losses = [torch.tensor(2.0), torch.tensor(4.0)]
    assert torch.equal(megatron_lm.avg_losses_across_data_parallel_group(losses), torch.tensor([2.0, 4.0]))
    gathered = megatron_lm.gather_across_data_parallel_groups({"a": torch.tensor(1.0), "b": [torch.ones(2, 3)]})
    assert gathered["a"].shape == (1,) and gathered["b"][0].shape == (2, 3)


def _cfg(tmp_path) -> str:
    path = tmp_path / "plain.yaml"
    path.write_text("compute_environment: LOCAL_MACHINE\n")
    return str(path)


def _launch_args(*argv):
    return launch_command_parser().parse_args([*argv, "train.py"])


def test_launch_flags_are_exported_as_acceleratess_variables(tmp_path):
    settings = resolve_launch(_launch_args(
        "--config_file", _cfg(tmp_path), "--use_megatron_lm", "--megatron_lm_tp_degree", "2",
        "--megatron_lm_pp_degree", "2", "--megatron_lm_num_micro_batches", "4",
        "--megatron_lm_use_distributed_optimizer", "true", "--num_processes", "8"), env={})
    env = settings.env
    assert env["HASTEN_USE_MEGATRON_LM"] == "true"
    assert (env["MEGATRON_LM_TP_DEGREE"], env["MEGATRON_LM_PP_DEGREE"]) == ("2", "2")
    assert env["MEGATRON_LM_NUM_MICRO_BATCHES"] == "4" and env["MEGATRON_LM_USE_DISTRIBUTED_OPTIMIZER"] == "true"
    with pytest.raises(ConfigError, match="a multiple of 4"):
        resolve_launch(_launch_args("--config_file", _cfg(tmp_path), "--use_megatron_lm",
                                    "--megatron_lm_tp_degree", "4", "--num_processes", "6"), env={})
    with pytest.raises(NotBuiltError, match="hasten trains your own nn.Module"):
        resolve_launch(_launch_args("--config_file", _cfg(tmp_path), "--use_megatron_lm",
                                    "--megatron_lm_eod_mask_loss", "true"), env={})


def test_accelerates_default_megatron_namespace_asks_for_nothing(tmp_path):
    """Accelerate's parser fills tp/pp degree 1 and gradient clipping 1.0 even without --use_megatron_lm."""
    args = _launch_args("--config_file", _cfg(tmp_path), "--cpu", "--num_processes", "1")
    args.megatron_lm_tp_degree, args.megatron_lm_pp_degree, args.megatron_lm_gradient_clipping = 1, 1, 1.0
    env = resolve_launch(args, env={}).env
    assert not any(name.startswith("MEGATRON_LM_") for name in env) and "HASTEN_USE_MEGATRON_LM" not in env


def test_unknown_keys_of_the_megatron_block_are_refused(tmp_path):
    from hasten.config import file as config_file

    path = tmp_path / "c.yaml"
    path.write_text("distributed_type: MEGATRON_LM\nmegatron_lm_config:\n  megatron_lm_tp_degre: 2\n")
    with pytest.raises(ConfigError, match="unknown key 'megatron_lm_config.megatron_lm_tp_degre'"):
        config_file.validate(config_file.read_raw(str(path)), str(path), fill_defaults=False, refuse_unbuilt=False)


CONFIG = """compute_environment: LOCAL_MACHINE
distributed_type: MEGATRON_LM
num_processes: 4
use_cpu: true
megatron_lm_config:
  megatron_lm_tp_degree: 2
  megatron_lm_pp_degree: 2
  megatron_lm_num_micro_batches: 2
  megatron_lm_recompute_activations: true
  megatron_lm_gradient_clipping: 0.5
"""


def test_megatron_config_tp2_pp2_on_four_processes_equals_one_process(tmp_path):
    """megatron_lm_tp_degree 2 x pp_degree 2 (2 micro-batches, recompute, clipping 0.5) from a config file, and
    MegatronLMPlugin(tp_degree=2, use_distributed_optimizer=True) in code: 5 SGD steps equal one process (1e-5);
    Megatron-only objects refuse in one line inside the run."""
    config = tmp_path / "megatron.yaml"
    config.write_text(CONFIG)
    result = launch("megatron_layouts.py", "file", "code", "refused", num_processes=4,
                    flags=("--config_file", str(config)), timeout=300)
    assert "megatron file: tp_degree 2 x pp_degree 2" in result.stdout
    assert "megatron code: tp_degree 2 x distributed optimizer over 2 ranks equals one process" in result.stdout
    assert "megatron refused" in result.stdout


# Every field only the Megatron-LM library reads, at a value other than Accelerate's default: refused in one line
# that names the native way (the fields at their defaults are accepted: test_defaults_are_accelerates).
MEGATRON_ONLY_VALUES = {
    "use_custom_fsdp": True, "overlap_cpu_optimizer_d2h_h2d": True, "no_load_optim": True, "eod_mask_loss": True,
    "no_save_optim": True, "optimizer_cpu_offload": True, "use_precision_aware_optimizer": True,
    "decoder_last_pipeline_num_layers": 2, "recompute_granularity": "selective", "recompute_method": "block",
    "recompute_num_layers": 2, "attention_backend": False, "expert_model_parallel_size": 2,
    "context_parallel_size": 2, "attention_dropout": 0.1, "hidden_dropout": 0.1, "attention_softmax_in_fp32": False,
    "expert_tensor_parallel_size": 2, "calculate_per_token_loss": False, "use_rotary_position_embeddings": False,
    "pipeline_model_parallel_split_rank": 1, "num_layers_per_virtual_pipeline_stage": 2,
    "is_train_batch_min": False, "train_iters": 10, "train_samples": 10, "weight_decay_incr_style": "linear",
    "start_weight_decay": 0.1, "end_weight_decay": 0.1, "lr_decay_style": "cosine", "lr_decay_iters": 10,
    "lr_decay_samples": 10, "lr_warmup_iters": 10, "lr_warmup_samples": 10, "lr_warmup_fraction": 0.1,
    "min_lr": 0.1, "consumed_samples": [0], "no_wd_decay_cond": print, "scale_lr_cond": print, "lr_mult": 2.0,
    "megatron_dataset_flag": True, "seq_length": 128, "encoder_seq_length": 128, "decoder_seq_length": 128,
    "tensorboard_dir": "/tmp/tb", "set_all_logging_options": True, "eval_iters": 5, "eval_interval": 5,
    "return_logits": True, "custom_train_step_class": object, "custom_train_step_kwargs": {"a": 1},
    "custom_model_provider_function": print, "custom_prepare_model_function": print,
    "custom_megatron_datasets_provider_function": print, "custom_get_batch_function": print,
    "custom_loss_function": print, "other_megatron_args": {"swiglu": True},
}


@pytest.mark.parametrize("name, value", sorted(MEGATRON_ONLY_VALUES.items()))
def test_every_megatron_only_field_away_from_its_default_is_refused(name, value):
    with pytest.raises(MegatronLMOnlyError, match=rf"MegatronLMPlugin\({name}=.*fix: ") as caught:
        MegatronLMPlugin(**{name: value})
    assert "\n" not in str(caught.value)


def test_megatron_only_fields_cover_the_dataclass():
    """The parametrized list above is every field that is neither honoured nor a record of the honoured ones."""
    import dataclasses

    honoured = {"tp_degree", "pp_degree", "num_micro_batches", "gradient_clipping", "sequence_parallelism",
                "recompute_activations", "use_distributed_optimizer", "megatron_lm_default_args"}
    assert {f.name for f in dataclasses.fields(MegatronLMPlugin)} == honoured | set(MEGATRON_ONLY_VALUES)


def test_megatron_lm_default_args_records_the_honoured_fields():
    plugin = MegatronLMPlugin(tp_degree=2, pp_degree=2, num_micro_batches=4, gradient_clipping=0.5,
                              use_distributed_optimizer=True)
    assert plugin.megatron_lm_default_args == {
        "tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2, "num_micro_batches": 4,
        "clip_grad": 0.5, "recompute_activations": False, "use_distributed_optimizer": True,
        "sequence_parallel": False}
